"""An fp16 repair stage of a build with an ``onnxruntime/cuda`` target is queued for the workers serving that target,
so that it is judged on their GPU (worker/fp16/stage.py); requeued, released and republished, it keeps that queue. On
both catalogs (the ``settings`` fixture: SQLite and PostgreSQL)."""

from __future__ import annotations

from enginefarm.core.domain import QUANTIZE_QUEUE, Target, build_queues
from enginefarm.core.spec import BuildSpec
from storage import liveness, quantizing, reconcile
from storage.db import session_scope
from storage.queue import Message
from tests.e2e.storage.test_quantize_recovery import tiny_model

CPU, SM90, RTX = (Target.parse(t) for t in ("onnxruntime/cpu-x86_64", "onnxruntime/cuda-sm90", "tensorrt-rtx/sm86"))
GPU_QUEUE = "quantize.onnxruntime.cuda-sm90"
FP16_REPAIR = BuildSpec(precision="fp16", accuracy_repair=True)


def _fp16_repair_build(settings, targets: list[Target]) -> tuple[int, dict, Message]:
    from api.services import builds as services

    with session_scope(settings) as s:
        served = liveness.served_targets(s, settings.worker_ttl_seconds)
        build, messages = services._create_build(s, tiny_model(s), targets, FP16_REPAIR, served)
        (stage,) = [m for m in messages if m.kind == "quantize"]
        return build.id, dict(build.quantize), stage


def test_a_worker_serving_a_cuda_target_consumes_its_stage_queue():
    assert build_queues([CPU, SM90]) == [CPU.queue, SM90.queue, QUANTIZE_QUEUE, GPU_QUEUE]
    assert build_queues([CPU]) == [CPU.queue, QUANTIZE_QUEUE] and build_queues([RTX]) == [RTX.queue]


def test_the_stage_goes_to_the_gpu_workers_queue_and_keeps_it(settings, monkeypatch):
    # No live worker serves cuda-sm90: the stage is judged on a CPU, on the queue every ONNX Runtime worker takes.
    _, stage, message = _fp16_repair_build(settings, [CPU, SM90])
    assert "queue" not in stage and message.queue == QUANTIZE_QUEUE and "(ONNX Runtime, CPU)" in stage["detail"]

    with session_scope(settings) as s:
        liveness.heartbeat(s, "gpu@host/1", "host", [str(CPU), str(SM90)], {})
    build_id, stage, message = _fp16_repair_build(settings, [CPU, SM90])
    assert stage["queue"] == GPU_QUEUE and message.queue == GPU_QUEUE, stage
    assert "ONNX Runtime CUDA, on a worker serving onnxruntime/cuda-sm90" in stage["detail"]
    _, other, message = _fp16_repair_build(settings, [CPU, RTX])  # no CUDA target: the CPU's queue
    assert "queue" not in other and message.queue == QUANTIZE_QUEUE

    # A stopping worker releases it: back on the GPU queue.
    with session_scope(settings) as s:
        assert quantizing.claim_quantize(s, build_id, "gpu@host/1")
    with session_scope(settings) as s:
        released = liveness.release_quantize(s, build_id, "gpu@host/1", "stopping")
    assert released is not None and Message.quantize(build_id, released).queue == GPU_QUEUE

    # The reconciler republishes a stage queued too long to the queue it names.
    sent: list[Message] = []
    monkeypatch.setattr(reconcile, "publish", lambda messages: sent.extend(messages))
    monkeypatch.setattr(reconcile, "queue_size", lambda name: 0)
    monkeypatch.setattr(settings, "republish_after_seconds", 0.0)
    reconcile.reconcile_once(settings)
    assert Message("quantize", build_id, GPU_QUEUE) in sent, sent
