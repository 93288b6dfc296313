"""The int8 stage before a build: source model + samples → one int8 model per target family the build needs
(ONNX Runtime's fastest CPU format, TensorRT's Q/DQ) → derived models in the catalog → the build's waiting
tasks queued, each against its family's model. Called by the quantize task (worker/tasks.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from enginefarm.core.bundle import BundleLimits
from enginefarm.core.config import Settings
from enginefarm.core.domain import ModelInfo, Target, TaskState, quantize_family
from enginefarm.core.errors import SpecInvalid
from enginefarm.core.hashing import sha256_file
from enginefarm.core.spec import BuildSpec
from enginefarm.core.worklock import Scratch
from enginefarm.graph.modelfile import inspect_upload
from storage import catalog, liveness, quantizing
from storage.blobs import BlobStore, model_key
from storage.blobwrite import store_with_row
from storage.db import session_scope
from worker.backends.base import BuildLog
from worker.cleanup import prepared_model
from worker.pipeline import model_file_from_store, samples_of


class _Source(NamedTuple):
    """The uploaded model the int8 models derive from, as their catalog rows name it."""

    name: str
    version: str
    id: int
    samples_sha256: str | None


def cpu_runner(spec: BuildSpec) -> Callable[[Path], Any]:
    """What opens a CPU artifact as the benchmark stage does (ONNX Runtime with the spec's threads)."""
    from enginefarm.measure.ort_runner import OrtRunner

    return lambda path: OrtRunner(path, spec.benchmark.threads)


def family_of_target(target: Target) -> str:
    return quantize_family(target.backend.value)


def model_of_task(session, task):
    """The model a build task builds from: its family's derived int8 model where the quantize stage made one
    per family, else the build's model."""
    derived = ((task.build.quantize or {}).get("derived_models") or {}).get(family_of_target(task.parsed_target))
    return catalog.get_model(session, derived) if derived else task.build.model


def run(build_id: int, store: BlobStore, settings: Settings) -> list[tuple[int, Target]]:
    """Quantize the build's model from its samples, once per target family; returns the build tasks to publish.
    An fp16 build's accuracy repair stage, queued the same way, runs worker/fp16/stage.py instead."""
    from worker.fp16 import stage as fp16_stage

    with session_scope(settings) as s:
        build = catalog.get_build(s, build_id)
        fp16 = fp16_stage.is_fp16_repair(build.quantize)
    if fp16:
        return fp16_stage.run(build_id, store, settings)
    with session_scope(settings) as s:
        build = catalog.get_build(s, build_id)
        spec = build.build_spec
        source = build.model
        fields = (source.blob_key, source.sha256, source.format)
        samples_fields = (source.samples_key, source.samples_sha256)
        info = ModelInfo.from_dict(source.info)
        origin = _Source(source.name, source.version, source.id, source.samples_sha256)
        # TensorRT first: the build's model_id points at the first family's model, as it did with one model.
        families = sorted(
            {family_of_target(t.parsed_target) for t in build.tasks if t.state == TaskState.WAITING.value},
            key=lambda f: f != "tensorrt",
        ) or ["tensorrt"]
    if not samples_fields[0]:
        raise SpecInvalid(f"model {origin.name} version {origin.version} has no samples to calibrate int8 with")
    model_path = model_file_from_store(store, *fields, settings)
    derived: dict[str, int] = {}
    reports: dict[str, dict] = {}
    with Scratch(settings) as scratch:
        samples = samples_of(store, *samples_fields, info, scratch)
        samples = {n: a for n, a in samples.items() if n not in spec.fixed_inputs}  # constants in the Q/DQ model
        log = BuildLog()
        float_model = prepared_model(model_path, spec, scratch, log)  # fold constants before Q/DQ goes in
        unrepaired = scratch / "unrepaired" / "model.int8.onnx"  # the failed original, where the repair keeps layers
        repaired = None
        if spec.accuracy_repair:  # the layers to keep in float so that int8 passes its gate, on this worker's CPU
            from worker.int8.repair import repair

            repaired = repair(
                float_model,
                samples,
                spec,
                info,
                scratch,
                cpu_runner(spec),
                unrepaired_to=unrepaired.parent,
                reference_model=model_path,
            )
        quantized = spec
        if repaired and repaired["kept"]:  # every family's int8 model keeps the same layers in float
            kept = sorted({*spec.keep_fp32_layers, *repaired["kept"]})
            quantized = spec.model_copy(update={"keep_fp32_layers": kept})
        beside = {"unrepaired": unrepaired} if unrepaired.exists() else {}
        timed: dict[str, dict] = {}
        for family in families:
            report, model_id = _derive(
                family,
                float_model,
                model_path,
                samples,
                quantized,
                info,
                scratch,
                store,
                settings,
                origin=origin,
                cleanup=log.tail() or None,
                beside=beside,
                timed=timed,
            )
            if repaired is not None:
                report["repair"] = repaired  # one repair for the build: the same figures on every family
            derived[family], reports[family] = model_id, report
        if repaired is not None:
            from worker.int8.variant import latency

            repaired.update(latency(reports.get("onnxruntime"), timed, kept_anything=bool(beside)))
            if beside:
                repaired["unrepaired"] = _catalogue_unrepaired(
                    unrepaired,
                    repaired,
                    timed.get("unrepaired"),
                    build_id,
                    store,
                    settings,
                    origin,
                )

    def release(s) -> tuple[list[tuple[int, Target]], list]:
        build = catalog.get_build(s, build_id)
        first = catalog.get_model(s, derived[families[0]])
        quantizing.set_quantize(
            s,
            build_id,
            TaskState.SUCCEEDED.value,
            derived_model_id=first.id,
            derived_version=first.version,
            report=reports[families[0]],
            reports=reports,
            derived_models=derived,
        )
        served = liveness.served_targets(s, settings.worker_ttl_seconds)
        models = {f: catalog.get_model(s, i) for f, i in derived.items()}
        return quantizing.release_waiting(
            s, build, first, served, model_for=lambda task: models[family_of_target(task.parsed_target)]
        )

    return quantizing.finish_stage(settings, release)


def _derive(
    family: str,
    float_model: Path,
    reference_model: Path,
    samples,
    spec: BuildSpec,
    info: ModelInfo,
    scratch: Path,
    store: BlobStore,
    settings: Settings,
    *,
    origin: _Source,
    cleanup: str | None,
    beside: dict[str, Path],
    timed: dict[str, dict],
) -> tuple[dict, int]:
    """Quantize for one family and catalogue the result (or find the same bytes catalogued); returns the
    report and the derived model's id. On the CPU, the models of ``beside`` are timed with the candidates, their
    figures put in ``timed``."""
    from worker.int8.quantize import quantize_for_spec

    out = scratch / family / "model.int8.onnx"
    out.parent.mkdir()
    if family == "onnxruntime":  # candidates measured on this worker's CPU, the fastest that passes kept
        from worker.int8.choice import quantize_for_cpu_beside

        report, figures = quantize_for_cpu_beside(
            float_model,
            samples,
            out,
            spec,
            info,
            scratch,
            cpu_runner(spec),
            beside,
            reference_model,
        )
        timed.update(figures)
    else:
        report = quantize_for_spec(float_model, samples, out, spec, family, scratch)
    derivation = {
        "kind": "int8-qdq",
        "source_model_id": origin.id,
        "samples_sha256": origin.samples_sha256,
        "graph_cleanup": cleanup,
        **report.to_dict(),
    }
    # The family's suffix keeps the two int8 models of one source apart; TensorRT's keeps the old name.
    suffix = "int8" if family == "tensorrt" else "int8-cpu"
    model_id = _catalogue(out, derivation, suffix, store, settings, origin)
    return report.to_dict(), model_id


def _catalogue_unrepaired(
    path: Path,
    repair: dict,
    figure: dict | None,
    build_id: int,
    store: BlobStore,
    settings: Settings,
    origin: _Source,
) -> dict:
    """The int8 model the repair judged before keeping layers in fp32, catalogued as a variant of the build: its
    own derived model with its failed accuracy and its CPU latency (``figure``: its timing beside the candidates,
    None where the build has no CPU target). Returns the build report's link to it."""
    derivation = {
        "kind": "int8-qdq",
        "variant": "unrepaired",
        "build_id": build_id,
        "source_model_id": origin.id,
        "samples_sha256": origin.samples_sha256,
        "accuracy": repair["before"],
        "repaired_kept": repair["kept"],
        **{k: repair[k] for k in ("latency_ms", "speedup", "latency_where", "latency_note") if k in repair},
        **json.loads((path.parent / "report.json").read_text()),
        "vs_fp32": (figure or {}).get("vs_fp32"),
    }
    model_id = _catalogue(path, derivation, "int8-cpu-unrepaired", store, settings, origin)
    with session_scope(settings) as s:
        row = catalog.get_model(s, model_id)
        found = {"model_id": row.id, "version": row.version, "sha256": row.sha256}
    return {**found, "recipe": repair["recipe"], "accuracy": repair["before"]}


def _catalogue(out: Path, derivation: dict, suffix: str, store: BlobStore, settings: Settings, origin: _Source) -> int:
    """Store an int8 model derived from the source and add its catalog row (or find the same bytes catalogued)."""
    sha = sha256_file(out)
    inspect = out.parent / "inspect"
    inspect.mkdir()
    inspected = inspect_upload(out, inspect, BundleLimits.of(settings))
    key = model_key(sha)

    def write(s) -> int:
        source = catalog.get_model(s, origin.id)
        derived = catalog.find_derived(s, source, sha) or catalog.add_model(
            s,
            name=origin.name,
            version=f"{origin.version}-{suffix}-{sha[:8]}",
            sha256=sha,
            fmt=inspected.format,
            size=out.stat().st_size,
            info=inspected.info,
            blob_key=key,
            source=source,
            derivation=derivation,
        )
        return derived.id

    return store_with_row(settings, store, key, out, sha, write)
