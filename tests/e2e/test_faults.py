"""Faults on real services: the catalog is the source of truth and the farm recovers by itself."""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from urllib.parse import urlparse

import httpx
import redis

from enginefarm.client import Client
from enginefarm.core.config import Settings
from enginefarm.graph.samples import conv_net, sample_spec, save_conv_net
from server import localservers
from server.embedded import Farm, issue_token
from storage.gc import collect_garbage
from tests.faults import TcpProxy, audit, private_postgres, slow
from tests.helpers import unique_name

NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}
PORTABLE = "tensorrt-rtx/portable"
# The PostgreSQL fault farm's broker: its own Redis database, so the session's workers never see its tasks.
FAULT_REDIS_DB = int(
    os.environ.get("ENGINEFARM_TEST_FAULT_REDIS_DB", "10")
)  # no session worker builds it: each test brings the workers it needs


def wait_task(c: Client, build_id: int, ok, timeout: float = 90.0, what: str = "") -> dict:
    """Poll the build's first task until ``ok(task)``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = c.get(f"/v1/builds/{build_id}")["tasks"][0]
        if ok(task):
            return task
        time.sleep(0.2)
    raise TimeoutError(f"task of build {build_id} never became {what}: {task}")


def test_worker_sigkilled_mid_build_the_task_finishes_on_another(farm, tmp_path, dist_settings):
    """Fault 1: SIGKILL a worker (its whole process group, as a crashed machine) while it builds. The reconciler
    sees its heartbeats stop and requeues the task; another worker builds it. One engine row, no orphan blob."""
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=84), unique_name("sigkill"))
        victim = farm.start_worker("victim", [PORTABLE], bench_targets=[], extra_env=slow(60))
        # The victim may not have sent its first heartbeat yet: the task waits for it.
        build = c.build(model["id"], [PORTABLE], {**sample_spec(), **NO_CHECKS}, queue_without_worker=True)
        wait_task(
            c,
            build["id"],
            lambda t: t["state"] == "running" and t["worker_id"].startswith("victim@"),
            what="running on the victim",
        )
        time.sleep(2)  # inside the build: the test backend holds it for 60 s
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)
        farm.workers.pop("victim")
        farm.start_worker("rescuer", [PORTABLE], bench_targets=[])
        try:
            done = c.wait_build(build["id"], timeout=150, poll=0.3)
        finally:
            farm.stop_process(farm.workers.pop("rescuer"))
        task = done["tasks"][0]
        assert task["state"] == "succeeded", task
        assert task["worker_id"].startswith("rescuer@") and task["attempts"] == 2 and not task["reused"]
        engines = c.engines(model=model["name"], target=PORTABLE)["items"]
        assert len(engines) == 1 and engines[0]["id"] == task["engine_id"]
    audit(dist_settings)


def test_worker_silent_past_its_ttl_takes_its_task_back(farm, tmp_path, dist_settings):
    """A live worker that stops beating (its main process paused with SIGSTOP, as one starved of CPU) has its
    running task requeued by the reconciler. Its build goes on in the pool child; once the worker beats again
    it takes the task back, since no other worker claimed it, and finishes it: one attempt, one build."""
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=88), unique_name("stall"))
        stalled = farm.start_worker("stalled", [PORTABLE], bench_targets=[], extra_env=slow(45))
        try:
            build = c.build(model["id"], [PORTABLE], {**sample_spec(), **NO_CHECKS}, queue_without_worker=True)
            wait_task(
                c,
                build["id"],
                lambda t: t["state"] == "running" and t["worker_id"].startswith("stalled@"),
                what="running on the stalled worker",
            )
            os.kill(stalled.pid, signal.SIGSTOP)  # the Celery main process (heartbeats); the pool child builds on
            try:
                requeued = wait_task(c, build["id"], lambda t: t["state"] == "queued", timeout=40, what="requeued")
            finally:
                os.kill(stalled.pid, signal.SIGCONT)
            assert "stopped sending heartbeats" in requeued["error"] and requeued["worker_id"] is None, requeued
            back = wait_task(c, build["id"], lambda t: t["state"] != "queued", timeout=20, what="taken back")
            assert back["state"] == "running" and back["worker_id"].startswith("stalled@") and back["error"] is None, (
                back
            )
            done = c.wait_build(build["id"], timeout=150, poll=0.3)
            # The requeue's message reaches the worker after its build and is skipped, not run again (and
            # leaves no message behind for the tests after this one).
            log_path = farm.log_dir / "worker-stalled.log"
            deadline = time.monotonic() + 60
            while "is not queued any more" not in log_path.read_text(errors="replace"):
                assert time.monotonic() < deadline, "the requeued message was never delivered"
                time.sleep(0.3)
        finally:
            farm.stop_process(farm.workers.pop("stalled"))
        task = done["tasks"][0]
        assert task["state"] == "succeeded" and task["worker_id"].startswith("stalled@"), task
        assert task["attempts"] == 1 and not task["reused"], task
        assert c.engines(model=model["name"], target=PORTABLE)["total"] == 1
    log = (farm.log_dir / "worker-stalled.log").read_text(errors="replace")
    assert "took back 1 running task(s)" in log
    audit(dist_settings)


def test_same_task_twice_at_once_gives_one_engine(farm, tmp_path, dist_settings):
    """Fault 5, both ways it happens: (a) one task's message delivered twice at once, to two workers; (b) two
    tasks for the same engine (identical bytes under two names, same spec and target) built at the same time.
    Each ends with one engine row and one blob."""
    from storage.queue import BUILD_TASK, make_celery

    spec = {**sample_spec(), **NO_CHECKS}
    for name in ("twin-1", "twin-2"):
        farm.start_worker(name, [PORTABLE], bench_targets=[], extra_env=slow(4))
    try:
        farm.wait_workers(["twin-1", "twin-2"])
        with Client(farm.url) as c:
            # (a) the same message twice
            model, _ = c.upload(save_conv_net(tmp_path / "a.onnx", seed=85), unique_name("twice"))
            build = c.build(model["id"], [PORTABLE], spec)
            make_celery(dist_settings).send_task(
                BUILD_TASK, args=[build["tasks"][0]["id"]], queue="build.tensorrt-rtx.portable"
            )
            task = c.wait_build(build["id"], timeout=120, poll=0.3)["tasks"][0]
            assert task["state"] == "succeeded" and task["attempts"] == 1, task
            assert c.engines(model=model["name"], target=PORTABLE)["total"] == 1

            # (b) two tasks, one engine key, built at the same moment
            path = save_conv_net(tmp_path / "b.onnx", seed=86)
            first, _ = c.upload(path, unique_name("same-bytes"))
            second, _ = c.upload(path, unique_name("same-bytes"))
            assert first["sha256"] == second["sha256"] and first["id"] != second["id"]
            builds = [c.build(m["id"], [PORTABLE], spec) for m in (first, second)]
            tasks = [c.wait_build(b["id"], timeout=120, poll=0.3)["tasks"][0] for b in builds]
            assert [t["state"] for t in tasks] == ["succeeded"] * 2, tasks
            assert {t["worker_id"].split("@")[0] for t in tasks} == {"twin-1", "twin-2"}  # really at once
            assert tasks[0]["engine_id"] == tasks[1]["engine_id"] and sum(t["reused"] for t in tasks) == 1
            assert c.engines(model=first["name"], target=PORTABLE)["total"] == 1
    finally:
        logs = "".join((farm.log_dir / f"worker-{n}.log").read_text(errors="replace") for n in ("twin-1", "twin-2"))
        for name in ("twin-1", "twin-2"):
            farm.stop_process(farm.workers.pop(name))
    assert f"task {task['id']} is not queued any more" in logs  # the second delivery was refused by the claim
    audit(dist_settings)


def test_s3_unreachable_while_storing_engines(farm, tmp_path, dist_settings):
    """Fault 4: the worker reaches S3 through a proxy that the test cuts mid-build, so storing the engine fails.
    The task is requeued with the reason and retried with backoff; once S3 is back it finishes, and no row
    points at a missing blob."""
    s3 = urlparse(dist_settings.s3_endpoint_url)
    proxy = TcpProxy((s3.hostname, s3.port)).restore()
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=87), unique_name("s3-cut"))
        farm.start_worker(
            "s3-cut", [PORTABLE], bench_targets=[], extra_env={**slow(5), "ENGINEFARM_S3_ENDPOINT_URL": proxy.url}
        )
        try:
            farm.wait_workers(["s3-cut"])
            build = c.build(model["id"], [PORTABLE], {**sample_spec(), **NO_CHECKS})
            wait_task(c, build["id"], lambda t: t["state"] == "running", what="running")
            time.sleep(1.5)  # the model is fetched; the build is in its pause
            proxy.cut()
            requeued = wait_task(
                c,
                build["id"],
                lambda t: "infrastructure error" in (t["error"] or ""),
                timeout=120,
                what="requeued after the S3 failure",
            )
            assert requeued["state"] in ("queued", "running") and "S3" in requeued["error"]
            time.sleep(6)  # more retries fail while it is down
            proxy.restore()
            done = c.wait_build(build["id"], timeout=180, poll=0.3)
        finally:
            proxy.cut()
            farm.stop_process(farm.workers.pop("s3-cut"))
        task = done["tasks"][0]
        assert task["state"] == "succeeded" and task["attempts"] >= 2, task
        engine = c.get(f"/v1/engines/{task['engine_id']}")
        assert c.engines(model=model["name"], target=PORTABLE)["total"] == 1
    audit(dist_settings)
    assert engine["size"] > 0


def test_postgres_restart_gives_503_and_the_farm_recovers(tmp_path, seaweedfs):
    """Fault 3: a farm on a PostgreSQL server of its own, restarted (down for 4 s) while clients upload and
    build. Clients get 503 with Retry-After, never a 500; the API recovers without a restart; every build
    submitted completes; no half-written row or blob remains."""
    redis_url = f"redis://127.0.0.1:6379/{FAULT_REDIS_DB}"
    redis.Redis.from_url(redis_url).flushdb()
    target = "onnxruntime/cpu-x86_64"
    with private_postgres() as pg:
        env = localservers.distributed_env(tmp_path / "data", pg.url, redis_url, seaweedfs)
        env.update(
            {
                "ENGINEFARM_HEARTBEAT_SECONDS": "1",
                "ENGINEFARM_WORKER_TTL_SECONDS": "10",
                "ENGINEFARM_RECONCILE_SECONDS": "1",
                "ENGINEFARM_REPUBLISH_AFTER_SECONDS": "3",
            }
        )
        settings = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()})
        with Farm(env, log_dir=tmp_path) as f:
            f.start_api()
            f.token = issue_token(settings, "pg-fault", ["admin"])
            f.start_worker("pg-worker", [target], bench_targets=[])
            f.wait_workers(["pg-worker"])
            seen: list[tuple[str, int, str | None, str]] = []
            accepted: list[int] = []
            stop = threading.Event()

            def traffic() -> None:
                with httpx.Client(base_url=f.url, headers=f.headers, timeout=30) as http:
                    i = 0
                    while not stop.is_set():
                        i += 1
                        r = http.post(
                            "/v1/models",
                            data={"name": f"pg-{i}"},
                            files={"file": ("m.onnx", conv_net(seed=1000 + i).SerializeToString())},
                        )
                        seen.append(("upload", r.status_code, r.headers.get("retry-after"), r.text[:300]))
                        if r.status_code == 201:
                            b = http.post(
                                "/v1/builds",
                                json={
                                    "model_id": r.json()["id"],
                                    "targets": [target],
                                    "spec": {**sample_spec(), **NO_CHECKS},
                                },
                            )
                            seen.append(("build", b.status_code, b.headers.get("retry-after"), b.text[:300]))
                            if b.status_code == 202:
                                accepted.append(b.json()["id"])
                        g = http.get("/v1/engines", params={"limit": 5})
                        seen.append(("list", g.status_code, g.headers.get("retry-after"), g.text[:300]))
                        time.sleep(0.05)

            thread = threading.Thread(target=traffic)
            thread.start()
            try:
                time.sleep(3)
                pg.stop()
                down_from = len(seen)
                time.sleep(4)
                pg.start()
                down_to = len(seen)
                time.sleep(8)  # the API and the worker reconnect by themselves
            finally:
                stop.set()
                thread.join(60)
            errors = [s for s in seen if s[1] >= 500 and s[1] != 503]
            assert not errors, errors[:5]
            unavailable = [s for s in seen[down_from:down_to] if s[1] == 503]
            assert unavailable, f"no 503 while PostgreSQL was down: {seen[down_from:down_to][:5]}"
            assert all(
                s[2] and int(s[2]) > 0 and "unavailable" in s[3] and "Traceback" not in s[3] for s in unavailable
            )
            after = [s for s in seen[down_to:] if s[0] == "upload"]
            assert after and after[-1][1] == 201, after[-3:]  # recovered, same API process
            assert f.api.poll() is None
            with Client(f.url, token=f.token) as c:
                done = [c.wait_build(b, timeout=120, poll=0.3) for b in accepted]
            states = [t["state"] for d in done for t in d["tasks"]]
            assert len(accepted) >= 5 and states == ["succeeded"] * len(states), states
            # An upload whose row could not commit because the catalog was going down also could not ask the
            # catalog whether another row needs its blob, so it kept the blob (storage/blobwrite.py): the
            # collector judges those. Its sweep, with no grace period, leaves nothing unreferenced behind.
            swept = collect_garbage(settings, grace_seconds=0)
            assert not swept.errors, swept.errors
            counts = audit(settings)
            assert counts["builds"] == len(accepted) and counts["engines"] == len(accepted)
            print(
                f"PostgreSQL restart: {len(seen)} requests, {len(unavailable)} got 503 while it was down, "
                f"{len(accepted)} builds all succeeded, {counts}"
            )


def queued_task_ids(broker: redis.Redis, queue: str) -> set[int]:
    """The task ids of the messages waiting in a Redis queue (kombu keeps each as JSON, its body base64 JSON)."""
    ids = set()
    for raw in broker.lrange(queue, 0, -1):
        args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
        ids.add(args[0])
    return ids


def test_redis_restarted_empty_with_20_tasks_queued_all_complete(farm, tmp_path, redis_url):
    target = "tensorrt-rtx/portable"  # no running worker builds it: the tasks wait in the queue
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=81), unique_name("faults"))
        builds = [
            c.build(
                model["id"],
                [target],
                {**sample_spec(), "workspace_mib": 64 + i, **NO_CHECKS},
                queue_without_worker=True,
            )
            for i in range(20)
        ]
        assert all(b["tasks"][0]["state"] == "queued" for b in builds)
        # Redis keeps nothing on disk: a restart empties every queue. Flushing the farm's database is that.
        broker = redis.Redis.from_url(redis_url)
        ours = {b["tasks"][0]["id"] for b in builds}
        # The farm's reconciler may have republished a task an earlier test left queued: count our messages only.
        assert ours <= queued_task_ids(broker, "build.tensorrt-rtx.portable")
        broker.flushdb()
        assert broker.llen("build.tensorrt-rtx.portable") == 0
        farm.start_worker("late-portable", [target], bench_targets=[])
        try:
            farm.wait_workers(["late-portable"])
            done = [c.wait_build(b["id"], timeout=180, poll=0.3) for b in builds]
        finally:
            farm.stop_process(farm.workers.pop("late-portable"))
        tasks = [d["tasks"][0] for d in done]
        assert [t["state"] for t in tasks] == ["succeeded"] * 20, [t["error"] for t in tasks]
        assert all(t["worker_id"].startswith("late-portable@") and t["attempts"] == 1 for t in tasks)
        engines = c.engines(model=model["name"], target=target, limit=100)["items"]
        assert len(engines) == 20 and len({e["spec_hash"] for e in engines}) == 20


def test_a_task_of_a_dead_worker_is_requeued_and_finished_by_another(farm, tmp_path, dist_settings):
    """A worker that died mid-task leaves its row running; once its heartbeats stop, the reconciler puts the
    task back in the queue and a live worker finishes it: one engine, no second row."""
    from storage import catalog
    from storage.db import session_scope

    target = "tensorrt-rtx/portable"
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=82), unique_name("faults"))
        build = c.build(model["id"], [target], {**sample_spec(), **NO_CHECKS}, queue_without_worker=True)
        task_id = build["tasks"][0]["id"]
        # What a SIGKILLed worker leaves behind: the claim committed, then silence (its heartbeats stopped).
        with session_scope(dist_settings) as s:
            assert catalog.claim_task(s, task_id, "killed-worker@gone")
        assert c.get(f"/v1/builds/{build['id']}")["tasks"][0]["state"] == "running"
        farm.start_worker("rescuer-portable", [target], bench_targets=[])
        try:
            done = c.wait_build(build["id"], timeout=120, poll=0.3)
        finally:
            farm.stop_process(farm.workers.pop("rescuer-portable"))
        task = done["tasks"][0]
        assert task["state"] == "succeeded" and task["worker_id"].startswith("rescuer-portable@")
        assert task["attempts"] == 2  # the dead worker's attempt and the rescuer's
        assert c.engines(model=model["name"], target=target)["total"] == 1


def test_a_task_delivered_too_often_is_failed_with_the_reason(dist_settings, tmp_path, farm):
    from storage import catalog
    from storage.db import session_scope

    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=83), unique_name("faults"))
        build = c.build(
            model["id"],
            ["tensorrt/sm90"],
            {**sample_spec(), **NO_CHECKS},  # nobody serves it
            queue_without_worker=True,
        )
        task_id = build["tasks"][0]["id"]
    with session_scope(dist_settings) as s:
        for attempt in range(3):  # three deliveries that each died with their worker
            assert catalog.claim_task(s, task_id, f"doomed-{attempt}@gone", max_deliveries=3)
            catalog.requeue_task(s, task_id, "worker died")
        assert not catalog.claim_task(s, task_id, "doomed-4@gone", max_deliveries=3)
        row = catalog.get_task(s, task_id)
        assert row.state == "failed" and "gave up after 3 deliveries" in row.error and row.attempts == 3
