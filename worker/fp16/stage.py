"""The fp16 accuracy repair stage before a build that asks ``accuracy_repair`` at fp16: source model (+ samples) →
the nodes to keep in fp32 (worker/fp16/repair.py, measured once: on this worker's GPU when the build has an
``onnxruntime/cuda`` target this worker runs, else on its CPU; ``judge_target``) → recorded on the build →
the build's waiting tasks queued. It runs as the int8 quantization stage does (the same queue, task and
``BuildRow.quantize`` column, with ``kind: fp16-repair``), but derives no model: every target builds from the uploaded
model, and its fp16 graph keeps the found nodes in fp32 (``spec_of_task``). Called by the quantize task
(worker/tasks.py) through worker/int8/stage.py."""

from __future__ import annotations

from pathlib import Path

from enginefarm.core.config import Settings
from enginefarm.core.domain import FP16_REPAIR_STAGE, ModelInfo, Target, TaskState, quantize_family
from enginefarm.core.probe.machineprobe import MachineProbe, probe_machine
from enginefarm.core.probe.policy import ort_cuda_targets
from enginefarm.core.spec import BuildSpec
from enginefarm.core.worklock import Scratch
from storage import catalog, liveness, quantizing
from storage.blobs import BlobStore
from storage.db import session_scope
from storage.tables import utcnow
from worker.backends.base import BuildLog
from worker.cleanup import prepared_model
from worker.pipeline import model_file_from_store, samples_of


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
    with session_scope(settings) as s:
        build = catalog.get_build(s, build_id)
        spec = build.build_spec
        source = build.model
        fields = (source.blob_key, source.sha256, source.format)
        samples_fields = (source.samples_key, source.samples_sha256)
        info = ModelInfo.from_dict(source.info)
        targets = [t.parsed_target for t in build.tasks]
        families = sorted(
            {quantize_family(t.parsed_target.backend.value) for t in build.tasks}, key=lambda f: f != "tensorrt"
        )
    model_path = model_file_from_store(store, *fields, settings)
    with Scratch(settings) as scratch:
        samples = samples_of(store, *samples_fields, info, scratch)
        float_model = prepared_model(model_path, spec, scratch, BuildLog())  # the model every target converts
        report = repair_on(float_model, model_path, samples, spec, info, scratch, judge_target(targets))

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
        return quantizing.release_waiting(s, build, build.model, served)

    return quantizing.finish_stage(settings, release)


def judge_target(targets: list[Target], probe: MachineProbe | None = None) -> Target | None:
    """The build's ``onnxruntime/cuda`` target that this worker (``probe``, else probed now) runs, to judge the fp16
    repair on the GPU the engine will run on; None (judge on the CPU) when the build has none or this worker has no
    GPU of its compute capability with ONNX Runtime's CUDA provider. The GPU's fp16 kernels round and overflow where
    the CPU's, which run most fp16 operators in fp32, do not (docs/fp16.md)."""
    wanted = [t for t in targets if t.is_ort_cuda]
    if not wanted:
        return None
    here = set(ort_cuda_targets(probe or probe_machine()))
    return next((t for t in sorted(wanted, key=str) if t in here), None)


def repair_on(
    float_model: Path, reference: Path, samples, spec: BuildSpec, info: ModelInfo, scratch: Path, gpu: Target | None
) -> dict:
    """The fp16 repair report, judged on ``gpu`` (an ``onnxruntime/cuda`` target this worker runs, from
    ``judge_target``) with the benchmark stage's CUDA runner, or on this worker's CPU when None."""
    from worker.fp16.repair import repair

    if gpu is None:
        from enginefarm.measure.ort_runner import OrtRunner

        return repair(
            float_model, reference, samples, spec, info, scratch, lambda p: OrtRunner(p, spec.benchmark.threads)
        )
    from enginefarm.measure.ort_cuda_runner import OrtCudaRunner
    from worker.backends.onnxruntime_cuda import gpu_for

    index = gpu_for(gpu, probe_machine()).index  # the GPU of the target's compute capability, as its build uses

    def runner(path: Path) -> OrtCudaRunner:  # one session per judged set (TF32 as the spec says)
        return OrtCudaRunner(path, tf32=spec.tf32, device_index=index)

    where = (
        f"ONNX Runtime's CUDA provider on this worker's GPU ({gpu}): the fp16 kernels the engine runs, TF32 "
        f"{'on' if spec.tf32 else 'off'} for the nodes kept in fp32"
    )
    return repair(float_model, reference, samples, spec, info, scratch, runner, gpu, where)
