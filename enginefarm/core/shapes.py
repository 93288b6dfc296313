"""Shapes as users write them: trtexec's NAME:DxD syntax, a deploy machine's shape request (min/opt/max per input),
the profiles an engine was built with, and Polygraphy's --val-range."""

from __future__ import annotations

import json
import math
from typing import Any

from enginefarm.core.spec import MAX_DIM


def parse_trtexec_shapes(text: str) -> dict[str, list[int]]:
    """``input:1x3x224x224,mask:1x128`` → {"input": [1, 3, 224, 224], "mask": [1, 128]} (trtexec's syntax)."""
    shapes: dict[str, list[int]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, dims = item.rpartition(":")
        name = name.strip("'\"")
        if not sep or not name:
            raise ValueError(f"shape {item!r} must be NAME:DxDxD, for example input:1x3x224x224")
        try:
            shapes[name] = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise ValueError(f"shape {item!r}: dims must be integers separated by 'x'") from None
    return shapes


def spec_shapes_from_trtexec(
    shapes: str | None = None,
    min_shapes: str | None = None,
    opt_shapes: str | None = None,
    max_shapes: str | None = None,
) -> dict[str, Any]:
    """The ``shapes``/``profiles`` part of a spec from trtexec's --shapes/--minShapes/--optShapes/--maxShapes."""
    out: dict[str, Any] = {}
    if shapes:
        out["shapes"] = parse_trtexec_shapes(shapes)
    ranges = [parse_trtexec_shapes(s) if s else {} for s in (min_shapes, opt_shapes, max_shapes)]
    names = set().union(*ranges)
    if names:
        lo, opt, hi = ranges
        missing = sorted(n for n in names if not (n in lo and n in hi))
        if missing:
            raise ValueError(f"inputs {missing} need both --minShapes and --maxShapes")
        out["profiles"] = [{n: {"min": lo[n], "opt": opt.get(n, hi[n]), "max": hi[n]} for n in sorted(names)}]
    return out


def shape_request(
    shapes: str | None = None,
    min_shapes: str | None = None,
    opt_shapes: str | None = None,
    max_shapes: str | None = None,
) -> dict[str, dict[str, list[int]]]:
    """What a deploy machine will run, from trtexec's --shapes/--minShapes/--optShapes/--maxShapes: per input,
    min/opt/max (``--shapes`` gives one shape: min = opt = max). Raises ValueError, naming the input."""
    parts = spec_shapes_from_trtexec(shapes, min_shapes, opt_shapes, max_shapes)
    wanted = {n: {"min": d, "opt": d, "max": d} for n, d in parts.get("shapes", {}).items()}
    for profile in parts.get("profiles", []):
        both = sorted(set(profile) & set(wanted))
        if both:
            raise ValueError(f"inputs {both} are given both in --shapes and in --minShapes/--maxShapes; give each once")
        wanted.update(profile)
    return check_shape_request(wanted)


def check_shape_request(wanted: dict[str, Any]) -> dict[str, dict[str, list[int]]]:
    """Validate a shape request (input → {min, opt, max}, or input → dims for one fixed shape) and return it in
    the min/opt/max form. Raises ValueError that says which input is wrong and how."""
    out: dict[str, dict[str, list[int]]] = {}
    if len(wanted) > 1000:
        raise ValueError(f"at most 1000 inputs in a shape request, not {len(wanted)}")
    for name, rng in wanted.items():
        if isinstance(rng, list):
            rng = {"min": rng, "opt": rng, "max": rng}
        if not isinstance(rng, dict) or set(rng) - {"min", "opt", "max"} or not {"min", "max"} <= set(rng):
            raise ValueError(f"shape of input {name!r}: give dims, or min, max (and opt) dims")
        rng = {"min": rng["min"], "opt": rng.get("opt", rng["max"]), "max": rng["max"]}
        for key, dims in rng.items():
            if (
                not isinstance(dims, list)
                or len(dims) > 16
                or not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= MAX_DIM for d in dims)
            ):
                raise ValueError(
                    f"{key} shape of input {name!r}: at most 16 dims, each a whole number within "
                    f"1..{MAX_DIM}, got {dims!r}"
                )
        if not len(rng["min"]) == len(rng["opt"]) == len(rng["max"]):
            raise ValueError(f"shape of input {name!r}: min, opt and max need the same number of dims")
        if not all(a <= b <= c for a, b, c in zip(rng["min"], rng["opt"], rng["max"])):
            raise ValueError(
                f"shape of input {name!r}: need min <= opt <= max in every dim, got "
                f"{format_dims(rng['min'])}, {format_dims(rng['opt'])}, {format_dims(rng['max'])}"
            )
        out[name] = rng
    return out


def shapes_key(shapes: dict[str, Any] | None) -> str:
    """A measurement's input shapes as one text whatever order or spacing they were written in: what two engines'
    latencies must share to be compared."""
    return json.dumps(shapes or {}, sort_keys=True, separators=(",", ":"))


def format_dims(dims: list[int]) -> str:
    """[1, 3, 640, 640] → 1x3x640x640 (trtexec's way)."""
    return "x".join(str(d) for d in dims)


# Bytes per element of each ONNX element type, by its TensorProto name (the sub-byte types take a byte each, as a
# buffer of them is allocated). Types not named here (STRING, new ones) count as 8: a pointer at least.
DTYPE_BYTES = {
    "BOOL": 1,
    "INT8": 1,
    "UINT8": 1,
    "INT4": 1,
    "UINT4": 1,
    "INT2": 1,
    "UINT2": 1,
    "FLOAT4E2M1": 1,
    "FLOAT8E4M3FN": 1,
    "FLOAT8E4M3FNUZ": 1,
    "FLOAT8E5M2": 1,
    "FLOAT8E5M2FNUZ": 1,
    "FLOAT8E8M0": 1,
    "INT16": 2,
    "UINT16": 2,
    "FLOAT16": 2,
    "BFLOAT16": 2,
    "INT32": 4,
    "UINT32": 4,
    "FLOAT": 4,
    "INT64": 8,
    "UINT64": 8,
    "DOUBLE": 8,
    "COMPLEX64": 8,
    "COMPLEX128": 16,
}
UNKNOWN_DTYPE_BYTES = 8


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of an ONNX element type name such as ``FLOAT``."""
    return DTYPE_BYTES.get(dtype.upper(), UNKNOWN_DTYPE_BYTES)


def format_bytes(size: int) -> str:
    """1073741824 → '1 GiB', 805306368 → '768 MiB' (binary units, at most one decimal)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size} bytes"


def engine_profiles(spec: dict[str, Any] | None, info: dict[str, Any] | None) -> list[dict[str, dict[str, list[int]]]]:
    """The optimization profiles an engine was built with, from its build's stored spec (whose ``profiles`` already
    fold in the spec's static ``shapes``) and its model's inputs: an input the spec leaves out that the model gives
    fixed dims runs only at those. Empty when a dynamic input's range is not known."""
    fixed = set((spec or {}).get("fixed_inputs") or {})
    static: dict[str, dict[str, list[int]] | None] = {}
    for t in (info or {}).get("inputs", []):
        dims = t.get("dims") or []
        if t["name"] in fixed:
            continue
        if dims and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
            static[t["name"]] = {"min": list(dims), "opt": list(dims), "max": list(dims)}
        elif not dims:
            continue  # a scalar input takes no shape
        else:
            static[t["name"]] = None
    profiles = [dict(p) for p in (spec or {}).get("profiles") or []]
    if not profiles:
        return [{n: r for n, r in static.items() if r is not None}] if static and None not in static.values() else []
    for p in profiles:
        for name, rng in static.items():
            if name not in p and rng is not None:
                p[name] = rng
    return profiles


def parse_val_ranges(items: list[str]) -> dict[str, tuple[float, float]]:
    """``["input_ids:[0,30521]", "mask:[0,1]"]`` → {"input_ids": (0.0, 30521.0), ...} (Polygraphy's --val-range)."""
    out: dict[str, tuple[float, float]] = {}
    for item in items:
        name, sep, bounds = item.rpartition(":")
        name = name.strip().strip("'\"")
        text = bounds.strip()
        if not sep or not name or not (text.startswith("[") and text.endswith("]")):
            raise ValueError(f"value range {item!r} must be NAME:[LOW,HIGH], for example input_ids:[0,30521]")
        try:
            low, high = (float(v) for v in text[1:-1].split(","))
        except ValueError:
            raise ValueError(f"value range {item!r}: give two numbers, LOW and HIGH") from None
        if not (math.isfinite(low) and math.isfinite(high)):  # float('1e999') is inf, not an error
            raise ValueError(f"value range {item!r}: LOW and HIGH must be finite numbers")
        out[name] = (low, high)
    return out
