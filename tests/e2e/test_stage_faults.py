"""Faults inside a stage, on a farm of this module's own (embedded: SQLite, local blobs, the database broker), so no
session worker takes the tasks: a worker SIGKILLed (its whole process group, as a crashed machine) while it
quantizes or benchmarks, and a build whose artifact does not load. Killed mid-build is
tests/e2e/test_faults.py::test_worker_sigkilled_mid_build_the_task_finishes_on_another (and test_races.py).

Each stage is requeued by the reconciler once the dead worker's heartbeats stop, and finished by another worker."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest
from sqlalchemy import select

from enginefarm.client import Client
from enginefarm.core.config import Settings
from enginefarm.graph.samples import sample_spec, save_conv_net
from server.embedded import Farm, issue_token
from storage.blobs import get_blob_store
from storage.db import session_scope
from storage.tables import BenchmarkTaskRow, EngineRow
from tests.helpers import unique_name

ORT = "onnxruntime/cpu-x86_64"
NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}
TTL_S = 10.0  # shorter, and a worker starved of CPU by the suite's own load is taken for dead
STAGE_DELAY_S = 300  # the victim's stage waits this long: it is killed well inside


@pytest.fixture(scope="module")
def lone(tmp_path_factory) -> Farm:
    data = tmp_path_factory.mktemp("stage-faults")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")}
    env.update(
        {
            "ENGINEFARM_DATA_DIR": str(data),
            "ENGINEFARM_BLOB_STORE": "local",
            "PYTHONUNBUFFERED": "1",
            "ENGINEFARM_HEARTBEAT_SECONDS": "1",
            "ENGINEFARM_WORKER_TTL_SECONDS": str(TTL_S),
            "ENGINEFARM_RECONCILE_SECONDS": "1",
            "ENGINEFARM_REPUBLISH_AFTER_SECONDS": "3",
        }
    )
    farm = Farm(env, log_dir=data, token=issue_token(Settings(data_dir=data, blob_store="local"), "faults", ["admin"]))
    farm.env = env  # this farm knows nothing of the session's (its catalog, broker and token)
    farm.settings = Settings(data_dir=data, blob_store="local")
    try:
        farm.start_api()
        yield farm
    finally:
        farm.stop()


def start(
    farm: Farm,
    name: str,
    targets: list[str],
    bench: list[str],
    env: dict[str, str] | None = None,
    slow_stages: bool = False,
):
    """A worker; ``slow_stages``: under tests.slow_stages, whose quantizer and benchmark wait as ``env`` says."""
    if not slow_stages:
        return farm.start_worker(name, targets, bench_targets=bench, extra_env=env)
    args = [
        sys.executable,
        "-m",
        "tests.slow_stages",
        "worker",
        "--name",
        name,
        "--concurrency",
        "1",
        "--targets",
        ",".join(targets) or "none",
        "--bench-targets",
        ",".join(bench) or "none",
    ]
    farm.workers[name] = farm._spawn(f"worker-{name}", args, env)
    return farm.workers[name]


def kill(farm: Farm, name: str) -> None:
    proc = farm.workers.pop(name)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def wait_for(what: str, probe: Callable[[], object], timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := probe():
            return got
        time.sleep(0.3)
    raise TimeoutError(f"never {what}")


def test_a_worker_killed_while_it_quantizes_has_its_stage_finished_by_another(lone, tmp_path):
    """Before: the build stayed waiting and its stage running on the dead worker's id, for good."""
    start(lone, "quantizer", [ORT], [], {"ENGINEFARM_TEST_QUANTIZE_DELAY_S": str(STAGE_DELAY_S)}, slow_stages=True)
    lone.wait_workers(["quantizer"], timeout=120)
    with Client(lone.url, token=lone.token) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=9191), unique_name("int8-kill"))
        np.savez(tmp_path / "s.npz", input=np.random.default_rng(9).standard_normal((8, 3, 32, 32)).astype(np.float32))
        c.upload_samples(model["id"], tmp_path / "s.npz")
        build = c.build(model["id"], [ORT], {**sample_spec(), "precision": "int8", **NO_CHECKS})

        def stage() -> dict:
            return c.get(f"/v1/builds/{build['id']}")["quantize"] or {}

        wait_for(
            "quantizing on the victim",
            lambda: stage().get("state") == "running" and stage()["worker_id"].startswith("quantizer@"),
        )
        time.sleep(1)  # inside the quantizer: the test hook holds it
        kill(lone, "quantizer")
        lost = wait_for("requeued", lambda: (s := stage()).get("state") == "queued" and s, timeout=TTL_S + 30)
        assert "quantizer@" in lost["error"] and "stopped sending heartbeats" in lost["error"], lost
        assert lost["worker_id"] is None and lost["attempts"] == 1, lost
        # Still counted against the queue limits while it waits: its task is waiting, not failed.
        assert [t["state"] for t in c.get(f"/v1/builds/{build['id']}")["tasks"]] == ["waiting"]
        start(lone, "rescuer", [ORT], [])
        try:
            done = c.wait_build(build["id"], timeout=240, poll=0.5)
        finally:
            lone.stop_process(lone.workers.pop("rescuer"))
    assert done["quantize"]["state"] == "succeeded" and done["quantize"]["worker_id"].startswith("rescuer@")
    (task,) = done["tasks"]
    assert task["state"] == "succeeded" and task["worker_id"].startswith("rescuer@"), task


def test_a_worker_killed_while_it_benchmarks_has_its_check_finished_by_another(lone, tmp_path):
    start(lone, "builder", [ORT], [])
    start(lone, "bencher", [], [ORT], {"ENGINEFARM_TEST_BENCH_DELAY_S": str(STAGE_DELAY_S)}, slow_stages=True)
    lone.wait_workers(["builder", "bencher"], timeout=120)
    try:
        with Client(lone.url, token=lone.token) as c:
            model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=9192), unique_name("bench-kill"))
            build = c.build(model["id"], [ORT], {**sample_spec(), "benchmark": QUICK})
            engine_id = c.wait_build(build["id"], timeout=180, poll=0.3)["tasks"][0]["engine_id"]

            def check() -> BenchmarkTaskRow | None:
                with session_scope(lone.settings) as s:
                    row = s.scalars(select(BenchmarkTaskRow).where(BenchmarkTaskRow.engine_id == engine_id)).first()
                    if row is not None:
                        s.expunge(row)
                    return row

            wait_for(
                "benchmarking on the victim",
                lambda: (r := check()) and r.state == "running" and r.worker_id.startswith("bencher@"),
            )
            time.sleep(1)
            kill(lone, "bencher")
            lost = wait_for("requeued", lambda: (r := check()) and r.state == "queued" and r, timeout=TTL_S + 30)
            assert "bencher@" in lost.error and "stopped sending heartbeats" in lost.error
            start(lone, "rescuer", [], [ORT])
            done = wait_for("checked", lambda: (r := check()) and r.state == "succeeded" and r, timeout=180)
            assert done.worker_id.startswith("rescuer@") and done.attempts == 2, (done.worker_id, done.attempts)
            report = c.wait_checks(model["id"], timeout=60)
    finally:
        for name in ("builder", "rescuer"):
            if name in lone.workers:
                lone.stop_process(lone.workers.pop(name))
    (row,) = [r for r in report["rows"] if r["target"] == ORT]
    assert row["status"] == "measured" and row["accuracy"]["pass"] is True, row


def test_an_artifact_that_does_not_load_fails_its_build_and_nothing_is_stored(lone, tmp_path):
    """The worker's backend leaves the artifact reading a weights file it does not carry (what ONNX Runtime's optimized
    model of an external-data bundle did): the load check fails the build before a blob or a row is written."""
    start(lone, "broken", [ORT], [], {"ENGINEFARM_BACKEND_WRAPPER": "tests.unloadable_backend:UnloadableBackend"})
    lone.wait_workers(["broken"], timeout=120)
    store = get_blob_store(lone.settings)
    before = set(store.keys("engines/"))
    try:
        with Client(lone.url, token=lone.token) as c:
            model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=9193), unique_name("unloadable"))
            build = c.build(model["id"], [ORT], sample_spec())
            done = c.wait_build(build["id"], timeout=180, poll=0.3)
    finally:
        lone.stop_process(lone.workers.pop("broken"))
    (task,) = done["tasks"]
    assert task["state"] == "failed" and task["engine_id"] is None, task
    assert "the built ONNX Runtime model does not load from its own bytes" in task["error"], task["error"]
    assert "read external data files it does not carry; it was not stored" in task["error"]
    with session_scope(lone.settings) as s:
        assert s.scalars(select(EngineRow).where(EngineRow.model_id == model["id"])).all() == []
    assert set(store.keys("engines/")) == before
