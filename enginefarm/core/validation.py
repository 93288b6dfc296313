"""Spec validation: every problem with building a spec for a model and targets, found before any build, as the
API answers them in one 422 (``validate_spec``, ``parse_targets``). The rules that come from a backend's documented
limits are data (``BACKEND_LIMITS``), each with its source. How large the input tensors may be is ``tensorlimits``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from enginefarm.core.domain import (
    ANONYMOUS_DIMS,
    JETSON_CCS,
    Backend,
    HardwareCompat,
    ModelInfo,
    Target,
    TensorInfo,
    cc_tuple,
)
from enginefarm.core.errors import problem
from enginefarm.core.spec import MAX_DIM, BuildSpec, Precision, ShapeRange, nested_values
from enginefarm.core.tensorlimits import TensorLimits, tensor_size_problems


def _check_range(loc: list[str | int], name: str, rng: ShapeRange, tensor: TensorInfo) -> list[dict[str, Any]]:
    problems = []
    rank = len(tensor.dims)
    for kind in ("min", "opt", "max"):
        dims = getattr(rng, kind)
        if len(dims) != rank:
            problems.append(
                problem(loc + [kind], f"input {name!r} has rank {rank}, {kind} shape {dims} has rank {len(dims)}")
            )
        elif any(d < 1 or d > MAX_DIM for d in dims):
            problems.append(
                problem(loc + [kind], f"input {name!r}: {kind} shape {dims} has a dim outside 1..{MAX_DIM}")
            )
    if problems:
        return problems
    for axis, (lo, mid, hi) in enumerate(zip(rng.min, rng.opt, rng.max)):
        if not lo <= mid <= hi:
            problems.append(problem(loc, f"input {name!r} axis {axis}: need min <= opt <= max, got {lo}, {mid}, {hi}"))
        fixed = tensor.dims[axis]
        if isinstance(fixed, int) and fixed > 0 and not lo == mid == hi == fixed:
            problems.append(
                problem(loc, f"input {name!r} axis {axis} is fixed at {fixed} in the model, spec gives {lo}/{mid}/{hi}")
            )
    return problems


def _precision_problems(
    spec: BuildSpec, info: ModelInfo, targets: list[Target], has_samples: bool
) -> list[dict[str, Any]]:
    problems = []
    p = spec.precision
    if p is Precision.INT8 and not info.has_qdq and not has_samples:
        problems.append(
            problem(
                ["spec", "precision"],
                "int8 needs a model with QuantizeLinear/DequantizeLinear (Q/DQ) nodes, or calibration samples to make "
                "one from: upload them with POST /v1/models/{id}/samples (enginefarm upload --samples FILE.npz)",
            )
        )
    elif p is Precision.FP8 and not info.has_qdq:
        problems.append(
            problem(
                ["spec", "precision"],
                "fp8 needs a quantized model with QuantizeLinear/DequantizeLinear (Q/DQ) nodes; this model has none",
            )
        )
    if spec.accuracy_repair and (p not in (Precision.INT8, Precision.FP16) or info.has_qdq):
        problems.append(
            problem(
                ["spec", "accuracy_repair"],
                "accuracy_repair applies to int8 built from calibration samples (the farm's own quantization) and "
                "to fp16 (the farm's own conversion), not to "
                + ("a model that holds Q/DQ already" if info.has_qdq else f"{p.value}"),
            )
        )
    for t in targets:
        cc = t.compute_capability
        built, why = target_precision(spec, t, info)
        if why and built is p:  # no precision this target can build instead, or the spec asks for none
            problems.append(problem(["targets", str(t)], why))
        if spec.hardware_compatibility is HardwareCompat.AMPERE_PLUS and t.is_gpu and cc and cc_tuple(cc) < (8, 0):
            problems.append(
                problem(["targets", str(t)], f"{t}: hardware compatibility ampere_plus needs an sm80+ target")
            )
        if spec.hardware_compatibility is HardwareCompat.AMPERE_PLUS and cc in JETSON_CCS:
            problems.append(problem(["targets", str(t)], f"{t}: ampere_plus engines are not supported on Jetson"))
    return problems


def _cannot_build(p: Precision, t: Target, info: ModelInfo) -> str | None:
    """Why target ``t`` cannot build this model in precision ``p``, or None when it can."""
    cc = t.compute_capability
    if t.backend is Backend.ONNXRUNTIME and p not in (Precision.FP32, Precision.FP16, Precision.INT8):
        return f"{t}: the CPU backend builds fp32, fp16 or int8 (Q/DQ), not {p.value}"
    if cc and p is Precision.BF16 and cc_tuple(cc) < (8, 0):
        return f"{t}: bf16 needs compute capability 8.0 or newer, {t.arch} is {cc}"
    if cc and p is Precision.FP8 and cc_tuple(cc) < (8, 9):
        return f"{t}: fp8 needs compute capability 8.9 or newer, {t.arch} is {cc}"
    if t.backend is Backend.TENSORRT_RTX and p is Precision.BF16:
        return (
            f"{t}: tensorrt-rtx builds strongly typed networks; bf16 needs a model whose tensors are already "
            "bf16, use fp32"
        )
    for limit in BACKEND_LIMITS:
        if t.backend is not limit.backend or t.arch not in limit.arches or p not in limit.precisions:
            continue
        hit = sorted(op for op in limit.op_types if info.op_types.get(op))
        if limit.op_types and not hit:
            continue
        has = f" (this model has {', '.join(f'{info.op_types[op]} {op}' for op in hit)})" if hit else ""
        return f"{t}: {limit.reason}{has}; {limit.advice} [source: {limit.source}]"
    return None


# Float precisions a target may build instead of the one asked for, nearest first. Quantized ones (int8, fp8)
# never fall back: their model is a Q/DQ graph that builds only as what it is.
FALLBACK_FROM = frozenset({Precision.FP32, Precision.FP16, Precision.BF16})


def target_precision(spec: BuildSpec, target: Target, info: ModelInfo) -> tuple[Precision, str | None]:
    """The precision ``target`` builds this model in, and why when that is not simply the spec's.

    A target that cannot build the spec's precision builds the nearest one it can (a GPU fp16, then fp32; the
    CPU fp32), when the spec allows it (``precision_fallback``, the default) and the precision is a float
    one: one build request serves targets of different abilities, each engine records what it is, and the
    reason says what happened. Otherwise the precision stays the spec's and the reason is the refusal."""
    wanted = spec.precision
    refusal = _cannot_build(wanted, target, info)
    if refusal is None:
        return wanted, None
    if spec.precision_fallback and wanted in FALLBACK_FROM:
        for p in (Precision.FP16, Precision.FP32) if target.is_gpu else (Precision.FP32,):
            if p is not wanted and _cannot_build(p, target, info) is None:
                return p, f"built {p.value} instead of {wanted.value}: {refusal}"
    return wanted, refusal


def validate_spec(
    spec: BuildSpec,
    info: ModelInfo,
    targets: list[Target],
    has_samples: bool = False,
    limits: TensorLimits | None = None,
) -> list[dict[str, Any]]:
    """Every problem with running ``spec`` on this model for these targets; empty when it is fine.
    ``has_samples``: the model has calibration samples, so int8 can be made from it. ``limits``: how large the
    input tensors the farm allocates may be (default: the settings')."""
    problems: list[dict[str, Any]] = tensor_size_problems(spec, info, limits or TensorLimits.of())
    by_name = {t.name: t for t in info.inputs}
    known = ", ".join(by_name) or "none"
    profiles = spec.normalized_profiles()
    ranges: list[tuple[list[str | int], str, ShapeRange]] = [
        (["spec", "shapes", n], n, ShapeRange(min=d, opt=d, max=d)) for n, d in spec.shapes.items()
    ]
    ranges += [
        (["spec", "profiles", i, n], n, rng) for i, profile in enumerate(spec.profiles) for n, rng in profile.items()
    ]
    for loc, name, rng in ranges:
        if name not in by_name:
            problems.append(problem(loc, f"unknown input {name!r} (model inputs: {known})"))
        else:
            problems += _check_range(loc, name, rng, by_name[name])
    problems += _fixed_input_problems(spec, by_name, known)
    for tensor in info.inputs:
        if not tensor.dynamic_axes or tensor.name in spec.fixed_inputs:
            continue
        if not profiles:
            problems.append(
                problem(
                    ["spec", "shapes", tensor.name],
                    f"input {tensor.name!r} has dynamic dims {tensor.dims}: give static 'shapes' or min/opt/max "
                    "'profiles'",
                )
            )
            continue
        for i, profile in enumerate(profiles):
            if tensor.name not in profile:
                problems.append(
                    problem(
                        ["spec", "profiles", i, tensor.name],
                        f"input {tensor.name!r} has dynamic dims {tensor.dims} but profile {i} gives it no shapes",
                    )
                )
    problems += _shared_dim_problems(info, profiles)
    for name, (low, high) in spec.benchmark.value_ranges.items():
        loc = ["spec", "benchmark", "value_ranges", name]
        if name not in by_name:
            problems.append(problem(loc, f"unknown input {name!r} (model inputs: {known})"))
        elif name in info.index_ranges:
            lo, hi = info.index_ranges[name]
            if low < lo or high > hi:
                problems.append(
                    problem(
                        loc,
                        f"input {name!r} indexes a table of {hi + 1} rows: its values must stay "
                        f"within {lo}..{hi}, not [{low:g}, {high:g}]",
                    )
                )
    if info.op_types:
        for op in spec.keep_fp32_ops:
            if op not in info.op_types:
                problems.append(
                    problem(
                        ["spec", "keep_fp32_ops", op],
                        f"the model has no {op!r} nodes to keep in fp32 (its op types: {', '.join(info.op_types)})",
                    )
                )
    seen: set[Target] = set()
    for t in targets:
        if t in seen:
            problems.append(problem(["targets", str(t)], f"target {t} is listed twice"))
        seen.add(t)
    problems += _precision_problems(spec, info, targets, has_samples)
    return problems


_INTEGER_TYPES = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL"})


def _fixed_input_problems(spec: BuildSpec, by_name: dict[str, TensorInfo], known: str) -> list[dict[str, Any]]:
    problems = []
    for name, value in spec.fixed_inputs.items():
        loc = ["spec", "fixed_inputs", name]
        tensor = by_name.get(name)
        if tensor is None:
            problems.append(problem(loc, f"unknown input {name!r} (model inputs: {known})"))
            continue
        shape, flat = nested_values(value)
        # JSON true is not 1, nor 2 a boolean: each input takes the kind of value its type holds.
        is_bool = tensor.dtype.upper() == "BOOL"
        if is_bool and not all(isinstance(x, bool) for x in flat):
            problems.append(problem(loc, f"input {name!r} is BOOL: give true or false, not {value!r}"))
        elif not is_bool and any(isinstance(x, bool) for x in flat):
            problems.append(problem(loc, f"input {name!r} is {tensor.dtype}: give numbers, not true or false"))
        elif tensor.dtype.upper() in _INTEGER_TYPES and not all(float(x).is_integer() for x in flat):
            problems.append(problem(loc, f"input {name!r} is {tensor.dtype}: give whole numbers, not {value!r}"))
        elif tensor.dynamic_axes and shape != [] and len(shape) != len(tensor.dims):
            problems.append(problem(loc, f"input {name!r} has rank {len(tensor.dims)}, the value has shape {shape}"))
        elif not tensor.dynamic_axes and shape not in ([], [int(d) for d in tensor.dims if d is not None]):
            problems.append(
                problem(
                    loc,
                    f"input {name!r} has shape {tensor.dims}; give a number or a value of that "
                    f"shape, not one of shape {shape}",
                )
            )
        elif tensor.dynamic_axes and shape == [] and tensor.dims:
            problems.append(
                problem(loc, f"input {name!r} has dynamic dims {tensor.dims}; give the whole value as nested lists")
            )
    return problems


def _shared_dim_problems(info: ModelInfo, profiles: list[dict[str, ShapeRange]]) -> list[dict[str, Any]]:
    """Inputs that name the same dim (``batch`` on input_ids and attention_mask) must get the same value in each
    profile's min, opt and max: TensorRT rejects the profile otherwise."""
    named: dict[str, list[tuple[str, int]]] = {}
    for tensor in info.inputs:
        for axis, dim in enumerate(tensor.dims):
            if isinstance(dim, str) and dim.strip() not in ANONYMOUS_DIMS:
                named.setdefault(dim, []).append((tensor.name, axis))
    problems = []
    for dim, uses in named.items():
        if len(uses) < 2:
            continue
        for i, profile in enumerate(profiles):
            for kind in ("min", "opt", "max"):
                values = {
                    (name, axis): getattr(profile[name], kind)[axis]
                    for name, axis in uses
                    if name in profile and axis < len(getattr(profile[name], kind))
                }
                if len(set(values.values())) > 1:
                    given = ", ".join(f"{name!r} axis {axis} = {v}" for (name, axis), v in values.items())
                    problems.append(
                        problem(
                            ["spec", "profiles", i],
                            (
                                f"inputs share the dim {dim!r}, so they must agree in every profile, but profile {i}'s "
                                f"{kind} gives {given}"
                            ),
                        )
                    )
    return problems


@dataclass(frozen=True)
class BackendLimit:
    """Something a backend cannot build, known before building, with where it is written down."""

    backend: Backend
    arches: frozenset[str]
    precisions: frozenset[Precision]
    op_types: frozenset[str]  # the limit applies when the model has any of these (empty: any model)
    reason: str
    advice: str
    source: str


BACKEND_LIMITS: tuple[BackendLimit, ...] = (
    BackendLimit(
        Backend.TENSORRT_RTX,
        frozenset({"sm75"}),
        frozenset({Precision.FP32, Precision.INT8}),
        frozenset({"MatMul", "Gemm", "LSTM", "GRU", "RNN"}),
        "TensorRT-RTX cannot compile fp32 matrix multiplies (MatMul, Gemm, and the ones inside LSTM/GRU/RNN) for "
        "Turing (sm75), and an int8 Q/DQ model dequantizes into fp32 ones: \"FP32 GEMM is not supported\"",
        "build fp16 for sm75, or fp32/int8 for sm80 and newer",
        "TensorRT-RTX support matrix, Turing row, FP32 footnote; confirmed by the 1.7.1 builder",
    ),
)


def parse_targets(texts: list[str]) -> tuple[list[Target], list[dict[str, Any]]]:
    """Parse target strings, collecting a problem for each bad one instead of stopping at the first."""
    targets, problems = [], []
    if not texts:
        problems.append(problem(["targets"], "name at least one target, for example tensorrt-rtx/sm86"))
    for i, text in enumerate(texts):
        try:
            targets.append(Target.parse(text))
        except ValueError as exc:
            problems.append(problem(["targets", i], str(exc)))
    return targets, problems
