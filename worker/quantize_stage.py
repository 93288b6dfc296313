"""The int8 stage before a build: source model + samples → Q/DQ model → derived model in the catalog →
the build's waiting tasks queued against it. Called by the quantize task (worker/tasks.py)."""

from __future__ import annotations

from enginefarm.config import Settings
from enginefarm.domain import ModelInfo, TaskState, Target
from enginefarm.spec import BuildSpec
from enginefarm.errors import SpecInvalid
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.storage import catalog
from enginefarm.storage import liveness
from enginefarm.storage.blobs import BlobStore, model_key
from enginefarm.hashing import sha256_file
from enginefarm.storage.blobwrite import store_with_row
from enginefarm.storage.db import session_scope
from enginefarm.worker.backends.base import BuildLog
from enginefarm.worker.cleanup import prepared_model
from enginefarm.bundle import BundleLimits
from enginefarm.worker.pipeline import model_file_from_store, samples_of
from enginefarm.worklock import Scratch


def run(build_id: int, store: BlobStore, settings: Settings) -> list[tuple[int, Target]]:
    """Quantize the build's model from its samples; returns the build tasks to publish."""
    from enginefarm.storage import queue
    from enginefarm.worker.quantize import quantize_qdq

    with session_scope(settings) as s:
        build = catalog.get_build(s, build_id)
        spec = BuildSpec(**build.spec)
        source = build.model
        fields = (source.blob_key, source.sha256, source.format)
        samples_fields = (source.samples_key, source.samples_sha256)
        info = ModelInfo.from_dict(source.info)
        name, version, source_id = source.name, source.version, source.id
    if not samples_fields[0]:
        raise SpecInvalid(f"model {name} version {version} has no samples to calibrate int8 with")
    model_path = model_file_from_store(store, *fields, settings)
    with Scratch(settings) as scratch:
        samples = samples_of(store, *samples_fields, info, scratch)
        samples = {n: a for n, a in samples.items() if n not in spec.fixed_inputs}  # constants in the Q/DQ model
        out = scratch / "model.int8.onnx"
        log = BuildLog()
        float_model = prepared_model(model_path, spec, scratch, log)  # fold constants before Q/DQ goes in
        report = quantize_qdq(float_model, samples, out, method=spec.calibration.method.value,
                              calibration_batch=spec.calibration.batch, scratch=scratch)
        sha = sha256_file(out)
        (scratch / "inspect").mkdir()
        inspected = inspect_upload(out, scratch / "inspect", BundleLimits.of(settings))
        key = model_key(sha)
        derivation = {"kind": "int8-qdq", "source_model_id": source_id, "samples_sha256": samples_fields[1],
                      "graph_cleanup": log.tail() or None, **report.to_dict()}

        def write(s) -> tuple[int, list[tuple[int, str]]]:
            source = catalog.get_model(s, source_id)
            derived = catalog.find_model_by_content(s, name, sha, source.project) or catalog.add_model(
                s, name=name, version=f"{version}-int8-{sha[:8]}", sha256=sha, fmt=inspected.format,
                size=out.stat().st_size, info=inspected.info, blob_key=key, source=source, derivation=derivation)
            build = catalog.get_build(s, build_id)
            served = liveness.served_targets(s, settings.worker_ttl_seconds)
            queued, checks = catalog.release_waiting(s, build, derived, served)
            catalog.set_quantize(s, build_id, TaskState.SUCCEEDED.value, derived_model_id=derived.id,
                                 derived_version=derived.version, report=report.to_dict())
            return queued, [(c.id, c.target) for c in checks]

        queued, check_ids = store_with_row(settings, store, key, out, sha, write)
    for check_id, target in check_ids:
        queue.publish_benchmark(check_id, target)
    return queued
