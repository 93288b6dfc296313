"""An embedded farm keeps dispatching builds while GPU benchmarks wait for a GPU it does not have.

The new user's sequence: a build for two GPU targets on a farm without those GPUs (their benchmarks stay pending),
then a build every few seconds. The reconciler asks the broker, on every pass, how deep the pending benchmarks'
queues are; each ask used to keep one connection of the broker's pool until the garbage collector freed it, so the
farm stalled once the pool was spent (publishes waited 30 s and failed, builds stayed queued). Here the reconciler
runs every 0.3 s, so a leak of one connection per pass spends the pool within seconds rather than minutes."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from enginefarm.client import Client
from enginefarm.core.config import Settings
from enginefarm.core.probe.machineprobe import normalize_platform
from enginefarm.graph.samples import sample_spec, save_conv_net
from server.embedded import Farm, issue_token
from tests.helpers import unique_name

ORT_TARGET = f"onnxruntime/cpu-{normalize_platform(platform.machine())}"
GPU_TARGETS = ["tensorrt-rtx/sm86", "tensorrt-rtx/sm89"]
BUILDS = 12
EVERY_S = 3.0


def broker_connections(pid: int, broker: Path) -> int:
    """The process's connections to the broker's database: each holds one descriptor on its file."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held += os.readlink(f"/proc/{pid}/fd/{fd}") == str(broker)
        except OSError:
            pass
    return held


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_builds_keep_coming_while_gpu_benchmarks_wait(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | {
        "ENGINEFARM_DATA_DIR": str(data),
        "ENGINEFARM_BLOB_STORE": "local",
        "ENGINEFARM_HEARTBEAT_SECONDS": "1",
        "ENGINEFARM_RECONCILE_SECONDS": "0.3",
        "ENGINEFARM_REPUBLISH_AFTER_SECONDS": "0.5",
    }
    settings = Settings(data_dir=data, blob_store="local")
    with Farm(env, log_dir=tmp_path, token=issue_token(settings, "dispatch", ["admin"])) as farm:
        farm.start_api()
        farm.start_worker("w", [*GPU_TARGETS, ORT_TARGET], bench_targets=[ORT_TARGET])
        farm.wait_workers(["w"])
        api_pid, broker = farm.api.pid, data / "broker.db"
        with Client(farm.url, token=farm.token) as c:
            model, _ = c.upload(save_conv_net(tmp_path / "gpu.onnx", seed=1), unique_name("gpu"))
            first = c.wait_build(c.build(model["id"], GPU_TARGETS, sample_spec())["id"], timeout=120)
            assert {t["state"] for t in first["tasks"]} == {"succeeded"}, first["tasks"]
            held, files, took = [], [], []
            for i in range(BUILDS):
                started = time.monotonic()
                model, _ = c.upload(save_conv_net(tmp_path / f"m{i}.onnx", seed=100 + i), unique_name("m"))
                build = c.build(model["id"], [ORT_TARGET, "tensorrt-rtx/sm86"], sample_spec())
                done = c.wait_build(build["id"], timeout=90)
                took.append(time.monotonic() - started)
                assert {t["state"] for t in done["tasks"]} == {"succeeded"}, (i, done["tasks"])
                held.append(broker_connections(api_pid, broker))
                files.append(open_files(api_pid))
                time.sleep(max(0.0, EVERY_S - took[-1]))
    log = (tmp_path / "api.log").read_text(errors="replace")
    assert "reconciler pass failed" not in log and "could not publish" not in log, log[-3000:]
    # The publishers' and the reconciler's: a few, not one more per pass (the pool allows 15).
    assert max(held) <= 3, held
    assert files[-1] <= files[0] + 5, files
    assert max(took) < 45, took  # a stalled publish alone waited 30 s
