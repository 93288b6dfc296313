"""Export a catalogued model from a farm as a Triton model repository: the plan the farm's resolution picks for each
compute capability, checked for accuracy where it is quantized, downloaded through the engine cache, and the model's
ONNX file as the CPU fallback, laid out by ``enginefarm.client.triton``."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from enginefarm.client.safepaths import UnsafeAnswer, in_folder, record_id
from enginefarm.client.transport import size_of
from enginefarm.client.triton import PLAN_BACKENDS, TritonRepository, batching, write_repository
from enginefarm.core.domain import cc_tuple
from enginefarm.core.machine import Machine

QUANTIZED = ("int8", "fp8")
# The scratch file of each upload format the farm takes (``core.bundle.FORMATS``).
UPLOAD_FILES = {"onnx": "upload.onnx", "zip": "upload.zip", "tar": "upload.tar"}

# Triton's TensorRT backend links full TensorRT: its plans are preferred, TensorRT-RTX ones taken where no full
# TensorRT engine runs on a compute capability.
PLAN_PREFERENCE = ("tensorrt", "tensorrt-rtx")


def triton_machine(cc: str) -> Machine:
    """The fingerprint an export resolves for: a GPU of compute capability ``cc`` whose other facts are unknown,
    because the repository is served wherever Triton runs."""
    return Machine(compute_capability=cc)


def config_spec(model: Mapping[str, Any], engines: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The profiles ``config.pbtxt`` is derived from, and a warning when the plans differ: one config serves every
    plan, so its max_batch_size is the smallest any of them takes."""
    specs = [{"profiles": e.get("profiles") or []} for e in engines]
    if not specs:
        return {}, []
    smallest = min(specs, key=lambda sp: batching(model, sp)[0])
    max_batch, warnings = batching(model, smallest)[0], []
    if any(sp != smallest for sp in specs):
        warnings.append(
            f"the plans were built with different optimization profiles; max_batch_size is {max_batch}, the "
            f"largest batch every one of them takes"
        )
    if max_batch and (least := min_batch(model, smallest)) > 1:
        warnings.append(
            f"the plans take batches of at least {least} (their profiles' smallest batch), but Triton's dynamic "
            f"batcher sends smaller ones when fewer requests wait, and those fail: build with a batch range that "
            f"starts at 1 (--minShapes with batch 1, --optShapes, --maxShapes)"
        )
    return smallest, warnings


def min_batch(model: Mapping[str, Any], spec: Mapping[str, Any]) -> int:
    """The smallest batch (axis 0) any of the spec's profiles takes for all of the model's inputs."""
    names = [t["name"] for t in model.get("inputs") or []]
    profiles = [p for p in spec.get("profiles") or [] if all(n in p for n in names)]
    return min((max(int(p[n]["min"][0]) for n in names) for p in profiles), default=1)


def export_from_farm(
    client: Any,
    model_name: str,
    out: Path,
    cache: Any,
    *,
    version: str | None = None,
    spec_hash: str | None = None,
    backend: str | None = None,
    precision: str | None = None,
    accept: list[str] | None = None,
    triton_version: int = 1,
    name: str | None = None,
    overwrite: bool = False,
) -> TritonRepository:
    """Write a Triton repository for a catalogued model: one plan per compute capability (downloaded through the
    engine cache, verified), the farm's onnxruntime/cuda artifacts with the provider options measured fastest for
    them, and its ONNX file as the CPU fallback.

    Each plan is the engine the farm's resolution picks for a GPU of that compute capability (the same
    ``/v1/resolve`` that ``enginefarm fetch`` asks, with the same filters), among full TensorRT engines first and
    TensorRT-RTX ones where none runs there. The model version defaults to the newest uploaded one; models derived
    from it (int8 Q/DQ) are its variants and compete in the same resolution. Raises NotFound when there is nothing
    to export.
    """
    from enginefarm.core.bundle import BundleLimits, unpack_bundle
    from enginefarm.core.errors import NotFound

    versions = [m for m in client.models(name=model_name, limit=500)["items"] if m.get("source_model_id") is None]
    if version:
        versions = [m for m in versions if m["version"] == version]
    if not versions:
        raise NotFound(f"no model {model_name!r}" + (f" version {version!r}" if version else "") + " in the catalog")
    model = max(versions, key=lambda m: m["id"])
    scratch_name = upload_name(model)  # before anything is written: an unknown format is refused here
    listed = [
        e
        for e in client.engines(model=model_name, limit=500)["items"]
        if model["version"] in (e["model_version"], e.get("variant_of"))
    ]

    def ask(machine: Machine, backend: str | None) -> dict[str, Any] | None:
        filters = {"spec_hash": spec_hash, "precision": precision, "backend": backend, "accept": accept}
        return _resolve_or_none(client, model_name, machine, version=model["version"], **filters)

    # A portable engine serves every compute capability it lists: each is asked for, and may get it.
    ccs = {
        cc
        for e in listed
        if e["backend"] in PLAN_BACKENDS
        for cc in ([e["compute_capability"]] if e["compute_capability"] else e["compute_capabilities"])
    }
    chosen: dict[str, Mapping[str, Any]] = {}
    for cc in sorted(ccs, key=cc_tuple):
        for b in [backend] if backend else PLAN_PREFERENCE:
            if (answer := ask(triton_machine(cc), backend=b)) is not None:
                chosen[cc] = answer["engine"]
                break
    # The farm's onnxruntime/cuda artifacts, one per compute capability it built them on, as resolve hands them to a
    # GPU of that capability whose ONNX Runtime has its CUDA provider.
    ort_ccs = {e["compute_capability"] for e in listed if str(e["target"]).startswith("onnxruntime/cuda-")} - {None, ""}
    ort_chosen: dict[str, Mapping[str, Any]] = {}
    for cc in sorted(ort_ccs, key=cc_tuple) if backend in (None, "onnxruntime") else []:
        answer = ask(Machine(compute_capability=cc, ort_cuda=True), backend="onnxruntime")
        if answer is not None and str(answer["engine"]["target"]).startswith("onnxruntime/cuda-"):
            ort_chosen[cc] = answer["engine"]
    for engine in [*chosen.values(), *ort_chosen.values()]:
        _check_quantized(client, engine, accept or [])
    spec, warnings = config_spec(model, list(chosen.values()))
    files = {cc: (e, client.cached(e, cache)[0]) for cc, e in chosen.items()}
    ort_files = {cc: (e, client.cached(e, cache)[0]) for cc, e in ort_chosen.items()}
    with tempfile.TemporaryDirectory(prefix="enginefarm-export-") as tmp:
        upload = in_folder(tmp, scratch_name)
        client.download_model(model["id"], upload, model["sha256"], size=size_of(model))
        member = None
        if model["format"] != "onnx":
            bundle = in_folder(tmp, "bundle")
            onnx_path = unpack_bundle(upload, model["format"], bundle, BundleLimits())
            upload, member = bundle, onnx_path.relative_to(bundle).as_posix()
        repo = write_repository(
            out,
            model,
            spec,
            files,
            upload,
            onnx_member=member,
            version=triton_version,
            name=name,
            overwrite=overwrite,
            ort_gpu=ort_files,
        )
    repo.warnings += warnings
    return repo


def upload_name(model: Mapping[str, Any]) -> str:
    """The scratch file a model's upload is saved as, from its ``format`` by a fixed map; UnsafeAnswer for a format
    this client does not know (a farm's answer never names a file)."""
    record_id(model.get("id"), f"model {model.get('name')!r}")
    fmt = model.get("format")
    name = UPLOAD_FILES.get(fmt) if isinstance(fmt, str) else None
    if name is None:
        raise UnsafeAnswer(
            f"the farm says model {model.get('name')!r} {model.get('version')!r} is of format "
            f"{model.get('format')!r}; this client exports only {', '.join(UPLOAD_FILES)}: nothing was written"
        )
    return name


def _check_quantized(client: Any, engine: Mapping[str, Any], accept: Sequence[str]) -> None:
    """Raise Conflict for an int8/fp8 engine whose accuracy check has not passed, naming where the check stands,
    unless ``accept`` takes it ("unchecked" for one never checked, "failed" for one that failed)."""
    from enginefarm.core.errors import Conflict

    passed = engine.get("accuracy_pass")
    if engine.get("precision") not in QUANTIZED or passed is True:
        return
    state = "failed" if passed is False else "unchecked"
    if state in accept:
        return
    checks = client.get(f"/v1/engines/{record_id(engine.get('id'), 'the engine')}").get("checks") or {}
    where = checks.get("state") or "none"
    raise Conflict(
        f"not exporting engine {engine['id']} ({engine['target']}, {engine['precision']}): its accuracy check "
        f"{'failed' if passed is False else 'has not passed'} (check {where}"
        + (f": {checks['detail']}" if checks.get("detail") else "")
        + "); export it once the check passes, or pass "
        f"--accept {state} to export it anyway",
        engine_id=engine["id"],
        check=where,
    )


def _resolve_or_none(client: Any, model: str, machine: Machine, **filters: Any) -> dict[str, Any] | None:
    """The resolution's answer, or None when no engine runs there (404)."""
    from enginefarm.client import ApiError

    try:
        return cast("dict[str, Any] | None", client.resolve(model, machine, **filters))
    except ApiError as exc:
        if exc.status_code == 404:
            return None
        raise
