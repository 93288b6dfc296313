"""Interleavings of uploads, builds, garbage collection, worker kills and reconciler runs against the real
services, chosen by Hypothesis; afterwards the farm must have lost nothing and left nothing.

The reconciler runs in the API process every second, through every example (it publishes to the farm's own
broker, which this process does not talk to); the other operations are started by the test.

Each example runs a handful of operations at once on a farm of its own (PostgreSQL, Redis, SeaweedFS, an
API and two Celery workers), then waits for every task to end and audits:
- every model and engine row's blob exists and its bytes match the row's sha256;
- after one more collection, no blob is left that no row points at (the collector runs with no grace
  period at all: only the per-key lock keeps it from the bytes of a write about to commit);
- every task ended, and built: none is stuck queued or running;
- no engine is catalogued twice, and identical bytes under one name are one model.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from enginefarm.core.config import Settings
from enginefarm.graph.samples import conv_net, sample_spec
from server import localservers
from server.embedded import Farm, issue_token
from storage.blobs import get_blob_store
from storage.db import session_scope
from storage.gc import collect_garbage
from storage.tables import BuildTaskRow, EngineRow, ModelRow
from tests.faults import slow

# Its own Redis database: the session's workers must never take this farm's tasks.
RACE_REDIS_DB = int(os.environ.get("ENGINEFARM_TEST_RACE_REDIS_DB", "9"))
WORKERS = {"race-rtx": "tensorrt-rtx/sm86", "race-ort": "onnxruntime/cpu-x86_64"}
NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}
MODELS = 3  # distinct byte strings; with two names each, identical uploads collide often
KILL_WAIT_S = 5.0
BUILD_DELAY_S = 1.0
# The test command runs the same few examples every time; ENGINEFARM_RACE_RANDOM=1 explores new ones.
EXAMPLES = int(os.environ.get("ENGINEFARM_RACE_EXAMPLES", "6"))
RANDOM = os.environ.get("ENGINEFARM_RACE_RANDOM") == "1"


class RaceFarm:
    def __init__(self, farm: Farm, settings: Settings):
        self.farm, self.settings = farm, settings
        self.models = {i: conv_net(seed=7100 + i).SerializeToString() for i in range(MODELS)}
        self.lock = threading.Lock()  # one kill or restart at a time
        self.builds: list[int] = []

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.farm.url, timeout=120, headers=self.farm.headers)

    # ------------------------------------------------------------------ operations

    def upload(self, model: int, name: int) -> int:
        with self.client() as c:
            r = c.post(
                "/v1/models", data={"name": f"race-{model}-{name}"}, files={"file": ("m.onnx", self.models[model])}
            )
        assert r.status_code in (200, 201), r.text
        return r.json()["id"]

    def build(self, model: int, target: str) -> None:
        model_id = self.upload(model, 0)
        with self.client() as c:
            r = c.post(
                "/v1/builds",
                json={
                    "model_id": model_id,
                    "targets": [target],
                    "queue_without_worker": True,
                    "spec": {**sample_spec((1, 2, 4)), **NO_CHECKS},
                },
            )
        assert r.status_code in (200, 201, 202), r.text
        with self.lock:
            self.builds.append(r.json()["id"])

    def gc(self) -> None:
        collect_garbage(self.settings, grace_seconds=0, allow_empty_catalog=True)

    def kill(self, which: int) -> None:
        """SIGKILL a worker's whole process group, as a crashed machine, once it runs a task (or after a few
        seconds), and start it again under the same name."""
        name = sorted(WORKERS)[which % len(WORKERS)]
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:
            with session_scope(self.settings) as s:
                if s.scalar(
                    select(BuildTaskRow.id)
                    .where(BuildTaskRow.state == "running", BuildTaskRow.worker_id.startswith(f"{name}@"))
                    .limit(1)
                ):
                    break
            time.sleep(0.1)
        with self.lock:
            proc = self.farm.workers.pop(name)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            self.start(name)

    def start(self, name: str) -> None:
        # Builds take a second longer than they need (the test backend), so a kill can land inside one.
        self.farm.start_worker(name, [WORKERS[name]], bench_targets=[], extra_env=slow(BUILD_DELAY_S))

    def run(self, op: tuple) -> None:
        getattr(self, op[0])(*op[1:])

    # ------------------------------------------------------------------ afterwards

    def settle(self, timeout: float = 240.0) -> None:
        """Wait for every task to end; the reconciler in the API requeues those of killed workers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with session_scope(self.settings) as s:
                open_tasks = s.scalar(
                    select(func.count())
                    .select_from(BuildTaskRow)
                    .where(BuildTaskRow.state.in_(("queued", "running", "waiting")))
                )
            if not open_tasks:
                return
            time.sleep(0.5)
        with session_scope(self.settings) as s:
            stuck = [
                (t.id, t.target, t.state, t.worker_id)
                for t in s.scalars(select(BuildTaskRow).where(BuildTaskRow.state.in_(("queued", "running", "waiting"))))
            ]
        raise AssertionError(f"tasks still open after {timeout} s: {stuck}")

    def audit(self) -> None:
        store = get_blob_store(self.settings)
        self.gc()
        with session_scope(self.settings) as s:
            models = list(s.scalars(select(ModelRow)))
            engines = list(s.scalars(select(EngineRow)))
            tasks = list(s.scalars(select(BuildTaskRow)))
        for kind, rows in (("model", models), ("engine", engines)):
            for row in rows:
                assert store.exists(row.blob_key), f"{kind} {row.id}: blob {row.blob_key} is missing"
                digest = hashlib.sha256(b"".join(store.iter_chunks(row.blob_key))).hexdigest()
                assert digest == row.sha256, f"{kind} {row.id}: the stored bytes are not the catalogued ones"
        referenced = {m.blob_key for m in models} | {e.blob_key for e in engines}
        unreferenced = set(store.keys()) - referenced
        assert not unreferenced, f"blobs no row points at, after a collection: {sorted(unreferenced)}"
        failed = [(t.id, t.target, t.error) for t in tasks if t.state != "succeeded"]
        assert not failed, f"tasks that did not build: {failed}"
        same_engine = [(e.model_sha256, e.spec_hash, e.target, e.backend_version) for e in engines]
        assert len(same_engine) == len(set(same_engine)), "an engine catalogued twice"
        same_model = [(m.project, m.name, m.sha256) for m in models]
        assert len(same_model) == len(set(same_model)), "identical bytes under one name made several models"


@pytest.fixture(scope="module")
def race(base_services, seaweedfs, tmp_path_factory):
    redis.Redis(host="127.0.0.1", port=6379, db=RACE_REDIS_DB).flushdb()
    with localservers.scratch_postgres("enginefarm_race") as url:
        env = localservers.distributed_env(
            tmp_path_factory.mktemp("race-data"), url, f"redis://127.0.0.1:6379/{RACE_REDIS_DB}", seaweedfs
        )
        # Dead workers are noticed within seconds, and a lost message is published again soon.
        env.update(
            {
                "ENGINEFARM_HEARTBEAT_SECONDS": "0.5",
                "ENGINEFARM_WORKER_TTL_SECONDS": "5",
                "ENGINEFARM_RECONCILE_SECONDS": "1",
                "ENGINEFARM_REPUBLISH_AFTER_SECONDS": "3",
                "ENGINEFARM_GC_INTERVAL_SECONDS": "0",
                "ENGINEFARM_MAX_UPLOADS_PER_TOKEN": "32",
            }
        )
        settings_ = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()})
        farm = Farm(env, log_dir=tmp_path_factory.mktemp("race-logs"))
        try:
            farm.start_api()
            farm.token = issue_token(settings_, "race", ["admin"])
            race = RaceFarm(farm, settings_)
            for name in WORKERS:
                race.start(name)
            farm.wait_workers(list(WORKERS))
            yield race
        finally:
            farm.stop()


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("upload"), st.integers(0, MODELS - 1), st.integers(0, 1)),
        st.tuples(st.just("build"), st.integers(0, MODELS - 1), st.sampled_from(sorted(WORKERS.values()))),
        st.tuples(st.just("gc")),
        st.tuples(st.just("kill"), st.integers(0, len(WORKERS) - 1)),
    ),
    min_size=4,
    max_size=10,
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=not RANDOM,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPERATIONS, seed=st.integers(0, 2**16))
def test_any_interleaving_loses_nothing_and_leaves_nothing(race, ops, seed):
    """Every operation starts at once, each after a small random delay, so their steps interleave."""
    delays = random.Random(seed)

    def run(op: tuple, delay: float) -> None:
        time.sleep(delay)
        race.run(op)

    with ThreadPoolExecutor(len(ops)) as pool:
        for future in [pool.submit(run, op, delays.uniform(0, 0.3)) for op in ops]:
            future.result()
    race.settle()
    race.audit()
