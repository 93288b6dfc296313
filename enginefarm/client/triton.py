"""Lay out a Triton Inference Server model repository from catalog data.

Up to three models per catalog model: ``<name>`` (platform ``tensorrt_plan``, one plan per compute
capability via ``cc_model_filenames``), ``<name>_ort_gpu`` (platform ``onnxruntime_onnx`` on GPU: the farm's
``onnxruntime/cuda`` artifacts, one per compute capability, with the CUDA provider options their GPU worker measured
fastest as the ``cuda`` execution accelerator's parameters) and ``<name>_onnx`` (platform ``onnxruntime_onnx`` on
CPU, the fallback). ``config.pbtxt`` is rendered by hand in protobuf text format. Which engines go in it, as a farm
resolves them, is ``enginefarm.client.tritonexport``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enginefarm.client.safepaths import check_name, in_folder
from enginefarm.client.tritonplans import engine_warnings, plan_layout
from enginefarm.core.domain import cc_tuple
from enginefarm.core.ortcuda import known_run_options

ONNX_TO_TRITON: dict[str, str] = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FLOAT16": "TYPE_FP16",
    "FLOAT": "TYPE_FP32",
    "DOUBLE": "TYPE_FP64",
    "STRING": "TYPE_STRING",
    "BFLOAT16": "TYPE_BF16",
}
_KIND_OF_PLATFORM = {"tensorrt_plan": "KIND_GPU", "onnxruntime_onnx": "KIND_CPU"}
PLAN_BACKENDS = ("tensorrt", "tensorrt-rtx")  # the backends whose engines are TensorRT plans
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_CC = re.compile(r"^[1-9][0-9]*\.[0-9]$")


@dataclass
class TritonRepository:
    """What ``write_repository`` wrote: model names, every file (final paths) and warnings."""

    root: Path
    models: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def triton_dtype(onnx_dtype: str, tensor: str) -> str:
    """The Triton ``TYPE_*`` name for an ONNX ``TensorProto.DataType`` name."""
    try:
        return ONNX_TO_TRITON[onnx_dtype]
    except KeyError:
        raise ValueError(f"tensor {tensor!r} has ONNX type {onnx_dtype!r}, which Triton cannot serve") from None


def sanitize_model_name(name: str) -> str:
    """A catalog name made safe as a directory: ASCII letters, digits, ``_ - .``; others become ``_``.

    A leading ``.`` also becomes ``_`` so the model directory is never hidden (or ``.``/``..``).
    """
    safe = _UNSAFE_NAME.sub("_", name)
    if safe.startswith("."):
        safe = "_" + safe[1:]
    if not safe:
        raise ValueError("model name is empty")
    return safe


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _quote(text: str) -> str:
    """A protobuf text-format string literal; non-printable and non-ASCII bytes as octal escapes."""
    body = "".join(_ESCAPES.get(chr(b)) or (chr(b) if 32 <= b < 127 else f"\\{b:03o}") for b in text.encode())
    return f'"{body}"'


def _dynamic(dim: Any) -> bool:
    return not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0


def batching(model: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[int, list[int], list[int]]:
    """``(max_batch_size, preferred_batch_sizes, per-profile batch limits)``; ``(0, [], [])`` if not batchable.

    Batchable when every input and output has a dynamic first dim and every profile gives every
    input. A profile's batch limit is the smallest axis-0 ``max`` over its inputs, so every input
    can batch that far; ``max_batch_size`` is the largest limit over the profiles (this is how
    Triton's TensorRT backend derives it). Preferred sizes are the distinct per-profile smallest
    axis-0 ``opt``. A profile whose axis-0 ``min`` is above 1 still counts: Triton may then send
    batches smaller than the engine accepts, and those requests fail.
    """
    inputs, outputs = model.get("inputs") or [], model.get("outputs") or []
    profiles = spec.get("profiles") or []
    if not inputs or not profiles:
        return 0, [], []
    if any(not t["dims"] or not _dynamic(t["dims"][0]) for t in [*inputs, *outputs]):
        return 0, [], []
    limits, opts = [], []
    for profile in profiles:
        if any(t["name"] not in profile for t in inputs):
            return 0, [], []
        limits.append(min(int(profile[t["name"]]["max"][0]) for t in inputs))
        opts.append(min(int(profile[t["name"]]["opt"][0]) for t in inputs))
    max_batch = max(limits)
    if max_batch < 1:
        return 0, [], []
    return max_batch, sorted({o for o in opts if 1 <= o <= max_batch}), limits


def fixed_dims(model: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, int]:
    """Named input dims that every profile fixes to one size (min = max, the same in each): an output dim of the
    same name has that size too."""
    sizes: dict[str, set[int]] = {}
    profiles = spec.get("profiles") or []
    for t in model.get("inputs") or []:
        for axis, dim in enumerate(t["dims"]):
            if not isinstance(dim, str) or not profiles:
                continue
            for profile in profiles:
                rng = profile.get(t["name"])
                if rng is None or len(rng["min"]) <= axis or rng["min"][axis] != rng["max"][axis]:
                    sizes.setdefault(dim, set()).add(-1)
                else:
                    sizes.setdefault(dim, set()).add(int(rng["min"][axis]))
    return {name: next(iter(v)) for name, v in sizes.items() if len(v) == 1 and next(iter(v)) > 0}


def _tensor_block(
    kind: str, tensors: Sequence[Mapping[str, Any]], drop_batch: bool, fixed: Mapping[str, int] | None = None
) -> list[str]:
    """An ``input [...]``/``output [...]`` block; a tensor left with no dims gets ``dims: [1]`` reshaped to a scalar.
    A dim is the model's static size, or the size every profile fixes for its name (``fixed``), else -1."""
    entries = []
    fixed = fixed or {}
    for t in tensors:
        dims = [
            fixed.get(d, -1) if isinstance(d, str) else -1 if _dynamic(d) else int(d)
            for d in t["dims"][1 if drop_batch else 0 :]
        ]
        lines = [f"    name: {_quote(t['name'])}", f"    data_type: {triton_dtype(t['dtype'], t['name'])}"]
        if dims:
            lines.append(f"    dims: [ {', '.join(map(str, dims))} ]")
        else:
            lines += ["    dims: [ 1 ]", "    reshape { shape: [ ] }"]
        entries.append("  {\n" + "\n".join(lines) + "\n  }")
    return [f"{kind} [", ",\n".join(entries), "]"]


def render_config(
    model: Mapping[str, Any],
    spec: Mapping[str, Any],
    *,
    name: str,
    platform: str,
    cc_model_filenames: Mapping[str, str] | None = None,
    default_model_filename: str | None = None,
    cuda_options: Mapping[str, str] | None = None,
) -> str:
    """``config.pbtxt`` text for ``platform`` ``tensorrt_plan`` (KIND_GPU) or ``onnxruntime_onnx`` (KIND_CPU; with
    ``cuda_options``, KIND_GPU and those options as the ``cuda`` execution accelerator's parameters, which Triton's
    ONNX Runtime backend hands to the CUDA provider)."""
    if platform not in _KIND_OF_PLATFORM:
        raise ValueError(f"platform {platform!r} is not one of {sorted(_KIND_OF_PLATFORM)}")
    instance_kind = "KIND_GPU" if cuda_options is not None else _KIND_OF_PLATFORM[platform]
    max_batch, preferred, _ = batching(model, spec)
    lines = [f"name: {_quote(name)}", f"platform: {_quote(platform)}", f"max_batch_size: {max_batch}"]
    fixed = fixed_dims(model, spec)
    for kind in ("input", "output"):
        if model.get(f"{kind}s"):
            lines += _tensor_block(kind, model[f"{kind}s"], drop_batch=max_batch > 0, fixed=fixed)
    if preferred:
        lines.append(f"dynamic_batching {{ preferred_batch_size: [ {', '.join(map(str, preferred))} ] }}")
    lines.append(f"instance_group [ {{ kind: {instance_kind} count: 1 }} ]")
    if cuda_options:
        params = " ".join(
            f"parameters {{ key: {_quote(k)} value: {_quote(v)} }}" for k, v in sorted(cuda_options.items())
        )
        accelerator = f'gpu_execution_accelerator: [ {{ name: "cuda" {params} }} ]'
        lines.append(f"optimization {{ execution_accelerators {{ {accelerator} }} }}")
    if default_model_filename:
        lines.append(f"default_model_filename: {_quote(default_model_filename)}")
    filenames = cc_model_filenames or {}
    for cc in sorted(filenames, key=cc_tuple):
        lines.append(f"cc_model_filenames {{ key: {_quote(cc)} value: {_quote(filenames[cc])} }}")
    return "\n".join(lines) + "\n"


def ort_gpu_options(engines: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The CUDA provider options every one of ``engines`` was measured fastest with (one config serves all their
    files); an option they disagree on is left at the provider's default."""
    options = [known_run_options(e.get("run_options")) for e in engines]
    if not options:
        return {}
    return {k: v for k, v in options[0].items() if all(o.get(k) == v for o in options[1:])}


def _check_onnx_member(root: Path, member: str) -> None:
    path = (root / member).resolve()
    if Path(member).is_absolute() or not path.is_relative_to(root.resolve()) or not path.is_file():
        raise ValueError(f"{member!r} is not a file inside {root}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def write_repository(
    out: Path,
    model: Mapping[str, Any],
    spec: Mapping[str, Any],
    engines: Mapping[str, tuple[Mapping[str, Any], Path]],
    onnx_source: Path | None,
    *,
    onnx_member: str | None = None,
    version: int = 1,
    name: str | None = None,
    overwrite: bool = False,
    ort_gpu: Mapping[str, tuple[Mapping[str, Any], Path]] | None = None,
) -> TritonRepository:
    """Write ``<out>/<name>`` (TensorRT plans) and ``<out>/<name>_onnx`` (ONNX Runtime on CPU).

    ``engines`` maps a compute capability (``"8.6"``) to the chosen engine and its downloaded file,
    copied to ``<version>/model_sm86.plan`` (``model_portable.plan`` for a portable TensorRT-RTX engine, written
    once however many compute capabilities it serves). ``default_model_filename``, which Triton loads on a GPU
    missing from ``cc_model_filenames``, is set only to a plan that runs beyond the compute capability it was
    built on (``plan_layout``); otherwise there is none, and a warning says which GPUs the model loads on.
    ``onnx_source`` is the ``.onnx`` file, or with ``onnx_member`` the unpacked bundle directory and
    the ``.onnx`` path inside it (the whole tree is copied, keeping external data beside the graph).
    An empty ``engines`` or a None ``onnx_source`` leaves that model out. ``ort_gpu`` maps a compute capability to an
    ``onnxruntime/cuda`` artifact and its file, written to ``<name>_ort_gpu`` as ``model_sm90.onnx`` and so on (the
    newest also the default: the graph runs on any GPU the provider supports), with the provider options every one
    of them was measured fastest with (``ort_gpu_options``). Models are staged in a
    temporary directory beside ``out`` (inside it when its parent is not writable) and renamed into
    place; an existing model directory raises ``FileExistsError`` unless ``overwrite``.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"Triton model versions are positive integers, not {version!r}")
    if name is not None and sanitize_model_name(name) != name:
        raise ValueError(
            f"model name {name!r} may hold only ASCII letters, digits, '_', '-' and '.', and not start with '.'"
        )
    base = name if name is not None else sanitize_model_name(model["name"])
    ort_gpu = dict(ort_gpu or {})
    if not engines and onnx_source is None and not ort_gpu:
        raise ValueError("nothing to write: no engines and no ONNX model")
    for cc, (engine, path) in ort_gpu.items():
        if not _CC.match(cc) or not str(engine.get("target", "")).startswith("onnxruntime/cuda-"):
            raise ValueError(f"engine {engine.get('id')} for {cc} is not an onnxruntime/cuda artifact")
        if not Path(path).is_file():
            raise ValueError(f"engine file {path} for {cc} does not exist")
    for cc, (engine, path) in engines.items():
        if not _CC.match(cc):
            raise ValueError(f"compute capability {cc!r} must be written MAJOR.MINOR, for example 8.6")
        if engine.get("backend") not in PLAN_BACKENDS:
            raise ValueError(
                f"engine {engine.get('id')} for {cc} is a {engine.get('backend')!r} engine, not a TensorRT plan"
            )
        if not Path(path).is_file():
            raise ValueError(f"engine file {path} for {cc} does not exist")
    if onnx_source is not None:
        if onnx_member is not None:
            _check_onnx_member(Path(onnx_source), onnx_member)
        elif not Path(onnx_source).is_file():
            raise ValueError(f"ONNX file {onnx_source} does not exist")

    max_batch, _, limits = batching(model, spec)
    staged: dict[str, tuple[str, list[tuple[Path, str]]]] = {}
    coverage: list[str] = []
    if engines:
        files, default, coverage = plan_layout(engines)
        text = render_config(
            model, spec, name=base, platform="tensorrt_plan", cc_model_filenames=files, default_model_filename=default
        )
        copies = {check_name(files[cc]): Path(path) for cc, (_, path) in engines.items()}
        staged[base] = (text, [(path, filename) for filename, path in copies.items()])
    if ort_gpu:
        ccs = sorted(ort_gpu, key=cc_tuple)
        files = {cc: f"model_sm{cc.replace('.', '')}.onnx" for cc in ccs}
        text = render_config(
            model,
            spec,
            name=f"{base}_ort_gpu",
            platform="onnxruntime_onnx",
            cc_model_filenames=files,
            default_model_filename=files[ccs[-1]],
            cuda_options=ort_gpu_options([e for e, _ in ort_gpu.values()]),
        )
        staged[f"{base}_ort_gpu"] = (text, [(Path(ort_gpu[cc][1]), check_name(files[cc])) for cc in ccs])
    if onnx_source is not None:
        member = onnx_member if onnx_member is not None else "model.onnx"
        text = render_config(
            model,
            spec,
            name=f"{base}_onnx",
            platform="onnxruntime_onnx",
            default_model_filename=Path(member).as_posix(),
        )
        staged[f"{base}_onnx"] = (text, [(Path(onnx_source), "." if onnx_member is not None else member)])

    out = Path(out)
    for model_name in staged:
        in_folder(out, model_name)  # a model's directory is a strict name, inside the repository
    taken = [m for m in staged if (out / m).exists() or (out / m).is_symlink()]
    if taken and not overwrite:
        raise FileExistsError(
            f"{', '.join(str(out / m) for m in taken)} already exists; pass overwrite=True to replace it"
        )
    out.mkdir(parents=True, exist_ok=True)
    result = TritonRepository(
        root=out, models=list(staged), warnings=coverage + engine_warnings(engines, limits, max_batch)
    )
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    except OSError:
        tmp = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        for model_name, (text, members) in staged.items():
            vdir = tmp / "new" / model_name / str(version)
            vdir.mkdir(parents=True)
            (vdir.parent / "config.pbtxt").write_text(text, encoding="utf-8")
            for src, rel in members:
                if src.is_dir():
                    shutil.copytree(src, vdir, dirs_exist_ok=True)
                else:
                    shutil.copyfile(src, vdir / rel)
        for model_name in staged:
            dest, new = out / model_name, tmp / "new" / model_name
            result.files += sorted(dest / p.relative_to(new) for p in new.rglob("*") if p.is_file())
            old = tmp / "old" / model_name
            if dest.exists() or dest.is_symlink():
                old.parent.mkdir(exist_ok=True)
                try:
                    dest.rename(old)
                except OSError:
                    _remove(dest)
            try:
                shutil.move(new, dest)
            except OSError:
                if old.exists() or old.is_symlink():
                    old.rename(dest)
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result
