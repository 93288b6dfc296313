"""An int8 build's quantization stage whose worker died: the reconciler puts it back in the queue as it does build and
benchmark tasks, and fails it, with the build's waiting tasks, once its worker was lost as often as a build task may
be delivered. On both catalogs (the ``settings`` fixture: SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

from enginefarm.core.domain import ModelInfo, Target, TaskState, TensorInfo
from enginefarm.core.spec import BuildSpec, Precision
from storage import catalog, liveness, quantizing
from storage.db import session_scope
from storage.tables import WorkerRow

ORT = Target.parse("onnxruntime/cpu-x86_64")


def tiny_model(s):
    """A catalogued model of a few bytes with unique name and sha256, for builds that are never built."""
    info = ModelInfo(
        inputs=[TensorInfo("x", "FLOAT", [1, 4])],
        outputs=[TensorInfo("y", "FLOAT", [1, 4])],
        opset=17,
        ir_version=8,
        producer="test",
        size=1,
    )
    return catalog.add_model(
        s,
        name=f"m-{uuid.uuid4().hex[:8]}",
        version=None,
        sha256=uuid.uuid4().hex * 2,
        fmt="onnx",
        size=1,
        info=info,
        blob_key="models/x",
    )


def int8_build(settings) -> int:
    """A build waiting for its quantization stage, as POST /v1/builds leaves one."""
    with session_scope(settings) as s:
        model = tiny_model(s)
        build, _ = catalog.add_build(s, model, BuildSpec(precision=Precision.INT8), [ORT], {}, waiting=True)
        build.quantize = {"state": TaskState.QUEUED.value, "source_model_id": model.id}
        return build.id


def beat(settings, worker_id: str, age_s: float = 0.0) -> None:
    with session_scope(settings) as s:
        liveness.heartbeat(s, worker_id, "host", [str(ORT)], {})
    with session_scope(settings) as s:
        s.get(WorkerRow, worker_id).last_seen = datetime.now(timezone.utc) - timedelta(seconds=age_s)


def live(settings) -> set[str]:
    with session_scope(settings) as s:
        return {w.id for w in liveness.live_workers(s, settings.worker_ttl_seconds)}


def lose(settings, build_id: int, worker_id: str) -> tuple[list[int], list[int]]:
    """``worker_id`` claims the stage, then falls silent past the TTL; one reconciler pass."""
    with session_scope(settings) as s:
        assert quantizing.claim_quantize(s, build_id, worker_id)
    beat(settings, worker_id, age_s=settings.worker_ttl_seconds + 5)
    with session_scope(settings) as s:
        requeued, failed = liveness.requeue_abandoned_quantize(s, live(settings), max_attempts=3)
        assert all(stage == catalog.get_build(s, i).quantize for i, stage in requeued)  # each stage as requeued
        return [i for i, _ in requeued], failed


def test_a_stage_running_on_a_live_worker_stays_put(settings):
    build_id = int8_build(settings)
    with session_scope(settings) as s:
        assert quantizing.claim_quantize(s, build_id, "q@host/live")
    beat(settings, "q@host/live")
    with session_scope(settings) as s:
        assert liveness.requeue_abandoned_quantize(s, live(settings), max_attempts=3) == ([], [])
        assert catalog.get_build(s, build_id).quantize["state"] == "running"


def test_a_stage_of_a_dead_worker_is_requeued_then_failed_after_the_most_attempts(settings):
    build_id = int8_build(settings)
    assert lose(settings, build_id, "q@host/dead1") == ([build_id], [])
    with session_scope(settings) as s:
        stage = catalog.get_build(s, build_id).quantize
        assert stage["state"] == "queued" and stage["worker_id"] is None and stage["attempts"] == 1
        assert "q@host/dead1 stopped sending heartbeats" in stage["error"]
        assert [t.state for t in catalog.get_build(s, build_id).tasks] == ["waiting"]
    assert lose(settings, build_id, "q@host/dead2") == ([build_id], [])
    assert lose(settings, build_id, "q@host/dead3") == ([], [build_id])
    with session_scope(settings) as s:
        build = catalog.get_build(s, build_id)
        assert build.quantize["state"] == "failed" and build.quantize["attempts"] == 3
        assert "gave up after 3 attempts" in build.quantize["error"]
        # The build's tasks end with it, so they stop counting against the queue limits.
        (task,) = build.tasks
        assert task.state == "failed" and "int8 quantization failed: gave up after 3 attempts" in task.error
        assert catalog.pending_tasks(s) == 0
        assert not quantizing.claim_quantize(s, build_id, "q@host/late")
