"""A worker that builds and benchmarks never holds a build behind a benchmark, running or queued.

Real worker processes, in both modes: a farm of its own (its own catalog and broker, so no session worker takes
its benchmarks) with one worker that builds for the CPU and sm86 and benchmarks CPU engines. Two CPU builds make
two long benchmarks (one running, one queued behind it); a build for sm86 submitted then must be built while the
first is still running and before the second starts. Only the order of events is asserted.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import pytest
import redis

from enginefarm.client import Client
from enginefarm.core.config import Settings
from enginefarm.graph.samples import sample_spec, save_conv_net
from server import localservers
from server.embedded import Farm, embedded_env, issue_token
from storage.db import session_scope
from storage.tables import BenchmarkTaskRow, BuildTaskRow, EngineRow
from tests.helpers import unique_name

CPU, GPU = "onnxruntime/cpu-x86_64", "tensorrt-rtx/sm86"
REDIS_DB = int(os.environ.get("ENGINEFARM_TEST_PRIO_REDIS_DB", "8"))  # its own: the fault farm's runs beside it
PG_DB = os.environ.get("ENGINEFARM_TEST_PG_DB", "enginefarm_test") + "_prio"
# Long enough that the sm86 build, submitted once the first benchmark runs, is done well before it ends.
BENCH_S = 45.0


@contextmanager
def farm_env(mode: str, tmp_path, seaweedfs: str):
    if mode == "embedded":
        yield embedded_env(tmp_path / "data")
        return
    redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB).flushdb()
    with localservers.scratch_postgres(PG_DB) as url:
        yield localservers.distributed_env(tmp_path / "data", url, f"redis://127.0.0.1:6379/{REDIS_DB}", seaweedfs)


@pytest.fixture(params=["embedded", "distributed"])
def both_farm(request, base_services, tmp_path):
    seaweedfs = request.getfixturevalue("seaweedfs") if request.param == "distributed" else ""
    with farm_env(request.param, tmp_path, seaweedfs) as env:
        env = {**env, "ENGINEFARM_HEARTBEAT_SECONDS": "1"}
        settings = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()})
        farm = Farm(env, log_dir=tmp_path, token=issue_token(settings, "priority", ["admin"]), stop_timeout=5)
        try:
            farm.start_api()
            farm.start_worker("both", [CPU, GPU], bench_targets=[CPU])
            farm.wait_workers(["both"])
            yield farm, settings
        finally:
            farm.stop()
            for log in sorted(tmp_path.glob("*.log")):
                text = log.read_text(errors="replace")
                if "Traceback" in text:
                    print(f"--- {log.name} ---\n{text[-3000:]}")


def _bench_task(settings: Settings, model_id: int) -> BenchmarkTaskRow:
    with session_scope(settings) as s:
        return (
            s.query(BenchmarkTaskRow)
            .join(EngineRow, BenchmarkTaskRow.engine_id == EngineRow.id)
            .filter(EngineRow.model_id == model_id)
            .one()
        )


def _wait(what: str, ok, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not happen within {timeout} s")


def test_a_build_runs_while_a_benchmark_runs_and_before_a_queued_one(both_farm, tmp_path):
    farm, settings = both_farm
    slow_checks = {**sample_spec(), "benchmark": {"warmup_ms": 0, "duration_s": BENCH_S, "iterations": 1}}
    with Client(farm.url, token=farm.token, timeout=60) as c:
        models = []
        for seed in (1, 2):
            model, _ = c.upload(save_conv_net(tmp_path / f"m{seed}.onnx", seed=seed), unique_name("prio"))
            build = c.build(model["id"], [CPU], slow_checks)
            assert {t["state"] for t in c.wait_build(build["id"], timeout=180, poll=0.2)["tasks"]} == {"succeeded"}
            models.append(model)
        first = _wait(
            "the first benchmark taken", lambda: (t := _bench_task(settings, models[0]["id"])).state != "queued" and t
        )
        # Ended already: the second CPU build was held behind it.
        assert first.state == "running", f"the first benchmark {first.state} before the second build was done"
        assert _bench_task(settings, models[1]["id"]).state == "queued"  # one measures, the other waits its turn

        model, _ = c.upload(save_conv_net(tmp_path / "m3.onnx", seed=3), unique_name("prio"))
        build = c.build(model["id"], [GPU], sample_spec())
        (task,) = c.wait_build(build["id"], timeout=300, poll=0.2)["tasks"]
        assert task["state"] == "succeeded", task

    running, queued = _bench_task(settings, models[0]["id"]), _bench_task(settings, models[1]["id"])
    with session_scope(settings) as s:
        built = s.get(BuildTaskRow, task["id"])
    # The same worker serves all three tasks.
    assert built.worker_id == first.worker_id == running.worker_id
    # The build was queued while the first benchmark ran, and was built before that benchmark ended ...
    assert first.started_at <= built.queued_at
    assert running.state == "running" and running.finished_at is None, (running.state, running.finished_at)
    # ... and before the benchmark queued behind it started.
    assert queued.state == "queued" and queued.started_at is None, (queued.state, queued.started_at)
