"""The fp16 accuracy repair stage before a build that asks ``accuracy_repair`` at fp16: source model (+ samples) →
the nodes to keep in fp32 (worker/fp16_repair.py, measured once on this worker's CPU) → recorded on the build →
the build's waiting tasks queued. It runs as the int8 quantization stage does (the same queue, task and
``BuildRow.quantize`` column, with ``kind: fp16-repair``), but derives no model: every target builds from the uploaded
model, and its fp16 graph keeps the found nodes in fp32 (``spec_of_task``). Called by the quantize task
(worker/tasks.py) through worker/quantize_stage.py."""

from __future__ import annotations

from pathlib import Path

from enginefarm.core.config import Settings
from enginefarm.core.domain import FP16_REPAIR_STAGE, ModelInfo, Target, TaskState
from enginefarm.core.spec import BuildSpec
from enginefarm.core.worklock import Scratch
from enginefarm.storage import catalog, liveness, quantizing
from enginefarm.storage.blobs import BlobStore
from enginefarm.storage.db import session_scope
from enginefarm.storage.tables import utcnow
from enginefarm.worker.backends.base import BuildLog
from enginefarm.worker.cleanup import prepared_model
from enginefarm.worker.pipeline import model_file_from_store, samples_of


def is_fp16_repair(stage: dict | None) -> bool:
    return (stage or {}).get("kind") == FP16_REPAIR_STAGE


def spec_of_task(build) -> BuildSpec:
    """The spec a build task builds with: the build's, with the nodes its fp16 repair stage found kept in fp32."""
    spec = build.build_spec
    stage = build.quantize or {}
    kept = stage.get("keep_fp32_layers") if is_fp16_repair(stage) else None
    if kept:
        spec = spec.model_copy(update={"keep_fp32_layers": sorted({*spec.keep_fp32_layers, *kept})})
    return spec


def run(build_id: int, store: BlobStore, settings: Settings) -> list[tuple[int, Target]]:
    """Find the nodes to keep in fp32 once for the build; returns the build tasks to publish."""
    from enginefarm.worker.quantize import family_of

    with session_scope(settings) as s:
        build = catalog.get_build(s, build_id)
        spec = build.build_spec
        source = build.model
        fields = (source.blob_key, source.sha256, source.format)
        samples_fields = (source.samples_key, source.samples_sha256)
        info = ModelInfo.from_dict(source.info)
        families = sorted(
            {family_of(t.parsed_target.backend.value) for t in build.tasks}, key=lambda f: f != "tensorrt"
        )
    model_path = model_file_from_store(store, *fields, settings)
    with Scratch(settings) as scratch:
        samples = samples_of(store, *samples_fields, info, scratch)
        float_model = prepared_model(model_path, spec, scratch, BuildLog())  # the model every target converts
        report = _repair(float_model, model_path, samples, spec, info, scratch)

    def release(s) -> tuple[list[tuple[int, Target]], list]:
        build = catalog.get_build(s, build_id)
        quantizing.set_quantize(
            s,
            build_id,
            TaskState.SUCCEEDED.value,
            # One repair for the build, the same figures under every target family (as int8's repair is).
            reports={family: {"repair": report} for family in families},
            keep_fp32_layers=report["kept"],
            finished_at=utcnow().isoformat(),
        )
        served = liveness.served_targets(s, settings.worker_ttl_seconds)
        queued, checks = quantizing.release_waiting(s, build, build.model, served)
        return queued, [(c.id, c.parsed_target) for c in checks]

    from enginefarm.storage import queue

    with session_scope(settings) as s:
        queued, check_ids = release(s)
    for check_id, target in check_ids:
        queue.publish_benchmark(check_id, target)
    return queued


def _repair(float_model: Path, reference: Path, samples, spec: BuildSpec, info: ModelInfo, scratch: Path) -> dict:
    from enginefarm.worker.evaluate import OrtRunner
    from enginefarm.worker.fp16_repair import repair

    def runner(path: Path) -> OrtRunner:
        return OrtRunner(path, spec.benchmark.threads)

    return repair(float_model, reference, samples, spec, info, scratch, runner)
