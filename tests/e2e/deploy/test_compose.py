"""deploy/ as teams run it: the farm's image built from deploy/Containerfile, deploy/compose.yaml brought up with
podman-compose (PostgreSQL, Redis with AOF, SeaweedFS, the migrations job, the API, two workers, the reconciler),
an upload -> build -> fetch through the stack's API, and build tasks queued in Redis surviving Redis being killed:
every one of them is built once a worker for it runs. Everything the stack made is removed, pass or fail.

No registry is reachable here, so deploy/podman.sh builds a Debian base image and the third-party services run as
stand-ins built from it (tests/deploy/*.Containerfile) with the interface compose.yaml uses."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.deploy.stack import DEPLOY, HERE, ROOT, STANDINS, Stack, build, free_port, image_size, prepare_machine, run

RTX, CPU = "tensorrt-rtx/sm86", "onnxruntime/cpu-x86_64"
QUEUES = {RTX: "build.tensorrt-rtx.sm86", CPU: "build.onnxruntime.cpu-x86_64"}
FARM_IMAGE = "localhost/enginefarm:compose-test"
QUEUED_MODELS = 3
WORKERS = ["worker-rtx", "worker-cpu"]

# A first run on a fresh machine installs podman, debootstraps the base and builds four images: about 5 minutes on
# two cores (4 with podman installed). With the images cached the module takes about a minute, 2.5 when
# pyproject.toml changed (the dependency layer is built again).
pytestmark = pytest.mark.timeout(1800)

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    start = time.monotonic()
    base = prepare_machine()
    TIMINGS["machine_setup_s"] = time.monotonic() - start
    for name in STANDINS:
        TIMINGS[f"{name}_image_s"] = build(
            HERE / f"{name}.Containerfile", f"localhost/enginefarm-test-{name}:latest", base, HERE
        )
    TIMINGS["farm_image_s"] = build(
        DEPLOY / "Containerfile", FARM_IMAGE, base, ROOT, ignorefile=DEPLOY / "Containerfile.dockerignore"
    )
    TIMINGS["farm_image_mb"] = image_size(FARM_IMAGE) / 1e6
    return {"base": base, "farm": FARM_IMAGE, **{n: f"localhost/enginefarm-test-{n}:latest" for n in STANDINS}}


@pytest.fixture
def stack(images, tmp_path) -> Stack:
    port = free_port()
    env = {
        "POSTGRES_PASSWORD": secrets.token_hex(12),
        "REDIS_PASSWORD": secrets.token_hex(12),
        "S3_ACCESS_KEY": "enginefarm",
        "S3_SECRET_KEY": secrets.token_hex(12),
        "ENGINEFARM_IMAGE": images["farm"],
        "POSTGRES_IMAGE": images["postgres"],
        "REDIS_IMAGE": images["redis"],
        "SEAWEEDFS_IMAGE": images["seaweedfs"],
        "ENGINEFARM_API_BIND": "127.0.0.1",
        "ENGINEFARM_API_PORT": str(port),
        "ENGINEFARM_API_WORKERS": "1",
        "ENGINEFARM_RTX_TARGETS": RTX,
        "ENGINEFARM_CPU_TARGETS": CPU,
        # Two cores: no benchmarks competing with the builds this test waits for.
        "ENGINEFARM_CPU_BENCH_TARGETS": "none",
        "ENGINEFARM_RTX_BENCH_TARGETS": "none",
    }
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    s = Stack(f"efcompose{os.getpid()}", env_file, port)
    start = time.monotonic()
    try:
        s.up("postgres", "redis", "seaweedfs")
        s.wait_healthy(["postgres", "redis", "seaweedfs"])
        s.up("migrate")
        code = run(["podman", "wait", s.container("migrate")], timeout=300).stdout.strip()
        assert code == "0", f"the migrations job exited {code}\n{s.logs('migrate', 'postgres')}"
        s.up("api", *WORKERS, "reconciler")
        s.wait_ready()
        TIMINGS["stack_up_s"] = time.monotonic() - start
        yield s
    finally:
        start = time.monotonic()
        s.down()
        TIMINGS["stack_down_s"] = time.monotonic() - start
        left = s.leftovers()
        assert not any(left.values()), f"compose down left {left}"


def llen(stack: Stack, queue: str) -> int:
    return int(stack.exec("redis", "redis-cli", "LLEN", queue))


def build_tasks(client: Client, build_ids: list[int]) -> list[dict]:
    return [t for b in build_ids for t in client.get(f"/v1/builds/{b}")["tasks"]]


def cli_fetch(stack: Stack, token: str, model: str, rtx_version: str, dest: Path, cache: Path) -> None:
    """`enginefarm fetch` as an sm86 deploy machine would run it against the stack's API."""
    env = {**os.environ, "ENGINEFARM_API_URL": stack.url, "ENGINEFARM_TOKEN": token, "ENGINEFARM_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "enginefarm",
            "fetch",
            model,
            "--cc",
            "8.6",
            "--gpu",
            "NVIDIA GeForce RTX 3090",
            "--memory-mib",
            "24576",
            "--driver",
            "580.65",
            "--trt-rtx",
            rtx_version,
            "--platform",
            "x86_64",
            "-o",
            str(dest),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_stack_builds_and_keeps_queued_tasks_across_a_redis_crash(stack, images, tmp_path):
    whole = time.monotonic()
    token = stack.exec("api", "enginefarm", "token", "create", "--scope", "admin", "--name", "compose-test")
    assert token.startswith("ef_")
    assert stack.exec("api", "id", "-u") == "10001"  # not root
    # The image's one HEALTHCHECK follows each container's role: /healthz, a worker's heartbeat, a live process.
    stack.wait_healthy(["api", *WORKERS, "reconciler"], timeout=60)

    with Client(stack.url, token=token, timeout=60) as c:
        # upload -> build -> fetch through the stack
        model, created = c.upload(save_conv_net(tmp_path / "convnet.onnx"), name="convnet")
        assert created
        job = c.build("convnet", [RTX, CPU], sample_spec())
        job.wait(timeout=300)
        assert {t["target"]: t["state"] for t in job.tasks} == {RTX: "succeeded", CPU: "succeeded"}, job.tasks
        files = job.download_all(tmp_path / "engines")  # verified against the catalog's sha256
        engines = {e["target"]: e for e in c.engines(model="convnet")["items"]}
        for target, path in files.items():
            assert hashlib.sha256(path.read_bytes()).hexdigest() == engines[target]["sha256"]
        assert engines[RTX]["compute_capability"] == "8.6" and engines[RTX]["backend"] == "tensorrt-rtx"
        fetched = tmp_path / "fetched.plan"
        cli_fetch(stack, token, "convnet", engines[RTX]["backend_version"], fetched, tmp_path / "cache")
        assert hashlib.sha256(fetched.read_bytes()).hexdigest() == engines[RTX]["sha256"]

        # Tasks queued in Redis while no worker runs, and no reconciler that could publish a lost one again.
        stack.compose("stop", *WORKERS, "reconciler")
        queued = []
        for seed in range(1, QUEUED_MODELS + 1):
            c.upload(save_conv_net(tmp_path / f"queued{seed}.onnx", seed=seed), name=f"queued{seed}")
            queued.append(c.build(f"queued{seed}", [RTX, CPU], sample_spec(), queue_without_worker=True).id)
        assert {t["state"] for t in build_tasks(c, queued)} == {"queued"}
        before = {q: llen(stack, q) for q in QUEUES.values()}
        assert before == {q: QUEUED_MODELS for q in QUEUES.values()}, before
        config = stack.exec("redis", "redis-cli", "CONFIG", "GET", "append*").split()
        config = dict(zip(config[::2], config[1::2]))
        assert (config["appendonly"], config["appendfsync"]) == ("yes", "always"), config

        # Redis killed outright (no shutdown save), then started again: the AOF alone brings the messages back.
        redis = stack.container("redis")
        run(["podman", "kill", "--signal", "KILL", redis])
        assert run(["podman", "wait", redis]).stdout.strip() == "137"
        run(["podman", "start", redis])
        stack.wait_healthy(["redis"], timeout=60)
        after = {q: llen(stack, q) for q in QUEUES.values()}
        assert after == before, f"queued messages lost in the Redis restart: {before} -> {after}"
        assert stack.wait_ready()["checks"]["broker"]["ok"]

        stack.compose("start", *WORKERS)
        deadline = time.monotonic() + 300
        while {t["state"] for t in build_tasks(c, queued)} != {"succeeded"}:
            states = [(t["target"], t["state"]) for t in build_tasks(c, queued)]
            assert not any(s in ("failed", "cancelled") for _, s in states), states
            assert time.monotonic() < deadline, f"not all queued tasks built: {states}\n{stack.logs(*WORKERS)}"
            time.sleep(1)
        assert len(build_tasks(c, queued)) == 2 * QUEUED_MODELS
        assert {q: llen(stack, q) for q in QUEUES.values()} == {q: 0 for q in QUEUES.values()}
        built = c.engines(limit=500)["items"]
        assert {(e["model_name"], e["target"]) for e in built} >= {
            (f"queued{i}", t) for i in range(1, QUEUED_MODELS + 1) for t in (RTX, CPU)
        }
    TIMINGS["scenario_s"] = time.monotonic() - whole
    print("\ncompose timings: " + json.dumps({k: round(v, 1) for k, v in TIMINGS.items()}))


def test_compose_file_accepts_every_profile(tmp_path):
    """The profiles the stack test does not run (their images cannot be pulled here) still parse, with the Grafana
    dashboard and Prometheus config mounted from deploy/."""
    env_file = tmp_path / "compose.env"
    env_file.write_text((DEPLOY / "compose.env.example").read_text())
    stack = Stack("efcomposeconfig", env_file, 8321)
    out = stack.compose("--profile", "flower", "--profile", "monitoring", "--profile", "gpu", "config").stdout
    for service in (
        "postgres",
        "redis",
        "seaweedfs",
        "migrate",
        "api",
        "worker-rtx",
        "worker-cpu",
        "reconciler",
        "worker-gpu",
        "flower",
        "prometheus",
        "grafana",
    ):
        assert f"\n  {service}:\n" in out, service
    assert "appendfsync" in out and "always" in out
    assert "./grafana/enginefarm.json:/var/lib/grafana/dashboards/enginefarm.json:ro" in out
    assert (DEPLOY / "prometheus.yml").read_text().count("api:8321") == 1
