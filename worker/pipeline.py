"""The stages a build task composes: fetch model → build → store. No Celery here, no TensorRT here."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from enginefarm.core.bundle import BundleLimits
from enginefarm.core.config import Settings
from enginefarm.core.domain import Backend, EngineDescriptor, ModelInfo, Target
from enginefarm.core.errors import BuildFailed, IntegrityError
from enginefarm.core.hashing import sha256_file
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.spec import BuildSpec
from enginefarm.graph.inputs import load_samples
from enginefarm.graph.modelfile import model_path_for
from storage.blobs import BlobStore
from worker.backends import BuildLog, get_backend
from worker.cleanup import prepared_model
from worker.diagnose import explain


def model_file_from_store(store: BlobStore, blob_key: str, sha256: str, fmt: str, settings: Settings) -> Path:
    """The model's .onnx path in this worker's cache, downloading and unpacking it once per sha256."""
    cache = settings.work_dir / "models" / sha256
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache) + ".lock"):  # several pool processes may want the same model
        blob, verified = cache / f"upload.{fmt}", cache / "verified"
        # Hash once per download, not once per task: a 2 GB model costs over a second to hash.
        if not verified.exists():
            fetch_verified(store, blob_key, sha256, blob)
            shutil.rmtree(cache / "unpacked", ignore_errors=True)
            (cache / "model.path").unlink(missing_ok=True)
            verified.touch()
        remembered = cache / "model.path"  # a bundle is unpacked once per worker, not once per task
        if remembered.exists() and (text := remembered.read_text()) and (path := Path(text)).is_file():
            return path
        path = model_path_for(blob, fmt, cache / "unpacked", BundleLimits.of(settings))
        # Written whole or not at all: a worker killed while writing it left an empty file, read as Path("")
        # (the current directory), and every later build of the model on this host failed to parse ".".
        partial = remembered.with_suffix(".partial")
        partial.write_text(str(path))
        os.replace(partial, remembered)
        return path


def fetch_verified(store: BlobStore, key: str, sha256: str | None, dest: Path) -> Path:
    """Download a blob and check it against the catalog's sha256 before anything uses it. A local store's blob is
    linked instead (``BlobStore.link_file``): no copy of a model that may be gigabytes, and no second one on disk;
    the worker only reads it. A catalog row without a sha256 (None) matches no blob: the check fails."""
    if not store.link_file(key, dest):
        store.get_file(key, dest)
    got = sha256_file(dest)
    if got != sha256:
        dest.unlink(missing_ok=True)
        raise IntegrityError(f"blob {key} has sha256 {got}, the catalog says {sha256}")
    return dest


def samples_of(store: BlobStore, key: str | None, sha256: str | None, info: ModelInfo, scratch: Path):
    """A model's samples from the blob store, verified and checked against the model; None without any."""
    return load_samples(fetch_verified(store, key, sha256, scratch / "samples.npz"), info) if key else None


@dataclass
class BuiltEngine:
    descriptor: EngineDescriptor
    path: Path
    seconds: float
    log: BuildLog


def engine_from_model(
    model_path: Path, spec: BuildSpec, target: Target, machine: MachineProbe | None, scratch: Path, log: BuildLog
) -> BuiltEngine:
    """Build one target; the descriptor's sha256 and size are those of the written file."""
    backend = get_backend(target.backend)
    out = scratch / "engine.plan"
    started = time.perf_counter()
    try:
        desc = backend.build(prepared_model(model_path, spec, scratch, log), spec, target, out, log, machine)
    except BuildFailed as exc:  # name the node and the next step; the builder's full text stays in the log
        raise BuildFailed(explain(exc.message, model_path)) from exc
    if target.backend is Backend.ONNXRUNTIME:  # whatever built it, an artifact that does not load is never stored
        from worker.backends.onnxruntime import check_loadable

        check_loadable(out)
    seconds = time.perf_counter() - started
    size = out.stat().st_size
    if not desc.sha256 or desc.size != size:  # a backend that hashed its artifact as it wrote it filled both
        desc.sha256, desc.size = sha256_file(out), size
    return BuiltEngine(desc, out, seconds, log)
