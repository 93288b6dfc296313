"""A check's reference outputs, kept for deploy machines: the inputs an accuracy check feeds an engine and ONNX
Runtime FP32's outputs on them (``enginefarm.measure.check.Reference``), stored once per reference model and inputs.

The worker that builds an engine computes it, so a farm without the engine's GPU still has what a deploy machine
with that GPU needs to check it (``enginefarm measure``). A failure here never fails the build: the engine is good;
only a device's check of it waits for a later build to compute the reference."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
from sqlalchemy.exc import IntegrityError

from enginefarm.core.config import get_settings
from enginefarm.core.domain import ModelInfo
from enginefarm.core.errors import EnginefarmError
from enginefarm.core.hashing import sha256_file
from enginefarm.core.spec import BuildSpec
from enginefarm.core.worklock import Scratch
from enginefarm.graph.inputs import fixed_arrays
from storage import builtengines, catalog, references
from storage.blobs import get_blob_store, reference_key
from storage.blobwrite import store_with_row
from storage.db import PATIENCE_S, session_scope
from worker.measure.evaluate import accuracy_feeds, accuracy_inputs
from worker.pipeline import model_file_from_store, samples_of

log = logging.getLogger(__name__)


def identity(model_sha: str, spec: BuildSpec, info: ModelInfo, feeds: list[dict[str, np.ndarray]]) -> str:
    """What makes two references the same: the model run in fp32, its fixed inputs and the check's inputs."""
    h = hashlib.sha256(model_sha.encode())
    for arrays in (fixed_arrays(spec, info), *feeds):
        for name in sorted(arrays):
            a = np.ascontiguousarray(arrays[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def ensure_reference(engine_id: int, project: str) -> None:
    """Give each of the project's checks of this engine that has no reference yet its reference, computing and
    storing it unless another engine's check made the same one. Logs and returns on any failure."""
    try:
        _ensure(engine_id, project)
    except (ImportError, EnginefarmError) as exc:  # no ONNX Runtime here, a reference model it cannot load
        log.warning("could not keep the reference outputs of engine %s: %s", engine_id, exc)
    except Exception:  # the build succeeded; a missing reference only delays a device's check
        log.warning("could not keep the reference outputs of engine %s", engine_id, exc_info=True)


def _ensure(engine_id: int, project: str) -> None:
    settings, store = get_settings(), get_blob_store(get_settings())
    with session_scope() as s:
        waiting = references.checks_without(s, engine_id, project)
        if not waiting:
            return
        _, model = builtengines.engine_in_project(s, engine_id, project)
        reference = catalog.get_model(s, model.source_model_id) if model.source_model_id else model
        specs = {t.id: t.build_spec for t in waiting}
        info = ModelInfo.from_dict(reference.info)
        model_id, ref_fields = reference.id, (reference.blob_key, reference.sha256, reference.format)
        samples_fields = (reference.samples_key, reference.samples_sha256)
    model_path = model_file_from_store(store, *ref_fields, settings)
    with Scratch(settings) as scratch:
        samples = samples_of(store, *samples_fields, info, scratch)
        by_identity: dict[str, list[int]] = {}
        for task_id, spec in specs.items():
            feeds, _ = accuracy_feeds(spec, info, samples)
            by_identity.setdefault(identity(ref_fields[1], spec, info, feeds), []).append(task_id)
        for ident, task_ids in by_identity.items():
            with session_scope() as s:
                found = references.find(s, ident)
                if found is not None:
                    references.link(s, task_ids, found.id)
                    continue
            ref = accuracy_inputs(model_path, specs[task_ids[0]], info, samples)
            path = scratch / f"reference-{ident[:16]}.npz"
            ref.save(path)
            sha, size = sha256_file(path), path.stat().st_size

            def write(s, ident=ident, task_ids=task_ids, sha=sha, size=size, origin=ref.origin) -> None:
                row = references.add(
                    s,
                    identity=ident,
                    model_id=model_id,
                    blob_key=reference_key(sha),
                    sha256=sha,
                    size=size,
                    origin=origin,
                )
                references.link(s, task_ids, row.id)

            try:
                store_with_row(settings, store, reference_key(sha), path, sha, write, patience_s=PATIENCE_S)
            except IntegrityError:  # another worker stored the same reference a moment before: use theirs
                with session_scope() as s:
                    first = references.find(s, ident)
                    if first is None:
                        raise
                    references.link(s, task_ids, first.id)
