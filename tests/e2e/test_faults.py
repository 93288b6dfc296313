"""Faults on real services: the catalog is the source of truth and the farm recovers by itself."""

from __future__ import annotations

import time

import redis

from enginefarm.client import Client
from enginefarm.samples import sample_spec, save_conv_net
from tests.helpers import unique_name

NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}


def test_redis_restarted_empty_with_20_tasks_queued_all_complete(farm, tmp_path, redis_url):
    target = "tensorrt-rtx/portable"  # no running worker builds it: the tasks wait in the queue
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=81), unique_name("faults"))
        builds = [c.build(model["id"], [target], {**sample_spec(), "workspace_mib": 64 + i, **NO_CHECKS})
                  for i in range(20)]
        assert all(b["tasks"][0]["state"] == "queued" for b in builds)
        # Redis keeps nothing on disk: a restart empties every queue. Flushing the farm's database is that.
        broker = redis.Redis.from_url(redis_url)
        assert broker.llen("build.tensorrt-rtx.portable") == 20
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
    from storage.tables import BuildTaskRow

    target = "tensorrt-rtx/portable"
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=82), unique_name("faults"))
        build = c.build(model["id"], [target], {**sample_spec(), **NO_CHECKS})
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
        build = c.build(model["id"], ["tensorrt/sm90"], {**sample_spec(), **NO_CHECKS})  # nobody serves it
        task_id = build["tasks"][0]["id"]
    with session_scope(dist_settings) as s:
        for attempt in range(3):  # three deliveries that each died with their worker
            assert catalog.claim_task(s, task_id, f"doomed-{attempt}@gone", max_deliveries=3)
            catalog.requeue_task(s, task_id, "worker died")
        assert not catalog.claim_task(s, task_id, "doomed-4@gone", max_deliveries=3)
        row = catalog.get_task(s, task_id)
        assert row.state == "failed" and "gave up after 3 deliveries" in row.error and row.attempts == 3
