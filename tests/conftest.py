"""Test session services: real PostgreSQL, Redis, SeaweedFS (S3) and Celery worker processes.

A missing PostgreSQL or Redis is started by deploy/services.sh; SeaweedFS is started here on
free ports. Nothing is skipped for want of a service.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from enginefarm.core.config import Settings
from enginefarm.graph.samples import save_conv_net
from server import localservers
from server.embedded import Farm, issue_token
from tests.helpers import UPLOAD_LIMIT, WORKER_A, WORKER_B

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["tests.gpumark"]
# Another checkout's suite may run on this machine at the same time: each names its own Redis db. So does each
# pytest-xdist worker of one suite (`make test` runs the e2e tier on two, a module whole on one of them).
# Redis dbs of the suite: 7 the soak's smoke, 8 the build-priority farm, 9 the race farm, 10 the fault farm, 11 the
# session farm (13 on the second worker), and the benches' smokes: 4 bench/load.py, 12 bench/e2e.py, 14 bench/edge.py,
# 15 bench/fleet.py (tests/e2e/test_bench_smoke.py holds them apart from the session farms').
XDIST_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
REDIS_DB = int(os.environ.get("ENGINEFARM_TEST_REDIS_DB", "11")) + 2 * XDIST_WORKER
PG_DB = os.environ.get("ENGINEFARM_TEST_PG_DB", "enginefarm_test")  # a prefix: scratch_postgres adds a random part


@pytest.fixture(scope="session")
def base_services() -> None:
    if not (localservers.port_open(5432) and localservers.port_open(6379)):
        subprocess.run(["bash", str(ROOT / "deploy" / "services.sh")], check=True)


@pytest.fixture(scope="session")
def pg_url(base_services) -> str:
    with localservers.scratch_postgres(PG_DB) as url:
        yield url


@pytest.fixture(scope="session")
def redis_url(base_services) -> str:
    redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB).flushdb()
    return f"redis://127.0.0.1:6379/{REDIS_DB}"


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory) -> str:
    """A real SeaweedFS server with S3 on free ports; yields its endpoint URL."""
    with localservers.seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def dist_env(pg_url, redis_url, seaweedfs, tmp_path_factory) -> dict[str, str]:
    """ENGINEFARM_* settings for the distributed mode: PostgreSQL, Redis, S3."""
    env = localservers.distributed_env(tmp_path_factory.mktemp("farm-data"), pg_url, redis_url, seaweedfs)
    # A worker counts as dead after 10 s without a heartbeat: shorter, and a worker starved of CPU by the
    # suite's own load (two cores) was taken for dead and its running check requeued.
    env.update(
        {
            "ENGINEFARM_HEARTBEAT_SECONDS": "1",
            "ENGINEFARM_WORKER_TTL_SECONDS": "10",
            "ENGINEFARM_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT),
            # Tests send up to 8 uploads at once with the session's one token (identical-upload races).
            "ENGINEFARM_MAX_UPLOADS_PER_TOKEN": "16",
            # The dashboard tests sign in with the session's one token many times a minute.
            "ENGINEFARM_SIGNIN_PER_MINUTE_PER_TOKEN": "1000",
            "ENGINEFARM_SIGNIN_PER_MINUTE_PER_ADDRESS": "1000",
            # The reconciler runs every second and takes a message as lost after 3 s in an empty queue.
            "ENGINEFARM_RECONCILE_SECONDS": "1",
            "ENGINEFARM_REPUBLISH_AFTER_SECONDS": "3",
        }
    )
    return env


@pytest.fixture(scope="session")
def dist_settings(dist_env) -> Settings:
    """The same settings, as an object, for checking the catalog and blob store directly."""
    return Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in dist_env.items()})


@pytest.fixture(scope="session")
def farm(dist_env, dist_settings, tmp_path_factory) -> Farm:
    """A distributed farm: the API under uvicorn and two Celery worker processes with different targets."""
    logs = tmp_path_factory.mktemp("farm-logs")
    # One prometheus-client multiprocess folder for the API and the workers, as `enginefarm up` makes: the API's
    # /metrics then counts the workers' builds too (tests/e2e/api/test_metrics.py).
    f = Farm({**dist_env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path_factory.mktemp("metrics"))}, log_dir=logs)
    try:
        f.start_api()
        # The session acts as an admin; the client and the CLI read the token from the environment.
        f.token = issue_token(dist_settings, "test-session", ["admin"])
        os.environ["ENGINEFARM_TOKEN"] = f.token
        f.start_worker("worker-a", WORKER_A)
        f.start_worker("worker-b", WORKER_B)
        f.wait_workers(["worker-a", "worker-b"])
        yield f
    finally:
        f.stop()
        os.environ.pop("ENGINEFARM_TOKEN", None)
        for log in sorted(logs.glob("*.log")):
            tail = log.read_text(errors="replace")[-3000:]
            if "Traceback" in tail:
                print(f"--- {log.name} ---\n{tail}", file=sys.stderr)


@pytest.fixture
def api(farm) -> httpx.Client:
    with httpx.Client(base_url=farm.url, timeout=60, headers=farm.headers) as client:
        yield client


@pytest.fixture(scope="session")
def conv_model(tmp_path_factory) -> Path:
    return save_conv_net(tmp_path_factory.mktemp("models") / "convnet.onnx")


@pytest.fixture(scope="session")
def auth_headers(farm) -> dict[str, str]:
    """Headers that authenticate as the session's admin token."""
    return farm.headers


@pytest.fixture(scope="session")
def client_wheel(tmp_path_factory) -> Path:
    """The package's wheel, as `pip install enginefarm` would get it (built once a session)."""
    import shutil

    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "enginefarm"
    # From a copy: an in-tree build leaves build/lib behind, whose stale modules a later wheel would carry.
    ignore = shutil.ignore_patterns(".git", ".venv*", ".gpu-carry", "build", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT, src, ignore=ignore)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return next(out.glob("enginefarm-*.whl"))
