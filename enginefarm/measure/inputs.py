"""The inputs an engine is timed with, where no samples are given: seeded random data within each input's declared
shape and range, the farm's rule (a worker's benchmark and a deploy machine's make the same arrays from the same
seed). Floats are standard normal, or uniform within a given range; integers are uniform within their range (the
spec's, or the table they index), else 0..1 as Polygraphy's default; booleans are random."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from enginefarm.core.domain import ModelInfo, TensorInfo

# ONNX's element type names (TensorProto.DataType) that numpy holds natively.
NUMPY_TYPES = {
    "FLOAT": np.float32,
    "FLOAT16": np.float16,
    "DOUBLE": np.float64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "BOOL": np.bool_,
}


def numpy_type(tensor: TensorInfo) -> np.dtype[Any]:
    """The numpy dtype of an input of ONNX element type ``tensor.dtype`` (FLOAT, INT64, ...)."""
    try:
        return np.dtype(NUMPY_TYPES[tensor.dtype])
    except KeyError:
        raise ValueError(f"input {tensor.name!r} has type {tensor.dtype}; random data is not defined for it") from None


def value_range(
    tensor: TensorInfo, info: ModelInfo, given: dict[str, tuple[float, float]] | None
) -> tuple[float, float] | None:
    """The range generated values of this input keep to: the spec's (Polygraphy's --val-range), else the table an
    integer input indexes, else None (the type's default)."""
    if given and tensor.name in given:
        low, high = given[tensor.name]
        return low, high
    if tensor.name in info.index_ranges:
        low, high = info.index_ranges[tensor.name]
        return float(low), float(high)
    return None


def random_inputs(
    info: ModelInfo, shapes: dict[str, list[int]], seed: int, value_ranges: dict[str, tuple[float, float]] | None = None
) -> dict[str, NDArray[Any]]:
    """Seeded random data within the declared shapes (see the module's docstring). The same seed gives the same
    inputs on every machine."""
    rng = np.random.default_rng(seed)
    out: dict[str, NDArray[Any]] = {}
    for tensor in info.inputs:
        dims, dtype = shapes[tensor.name], numpy_type(tensor)
        bounds = value_range(tensor, info, value_ranges)
        if dtype.kind == "f":
            data = rng.standard_normal(dims) if bounds is None else rng.uniform(bounds[0], bounds[1], size=dims)
            out[tensor.name] = data.astype(dtype)
        elif dtype.kind in "iu":
            low, high = (0, 1) if bounds is None else (int(np.ceil(bounds[0])), int(np.floor(bounds[1])))
            out[tensor.name] = rng.integers(low, max(low, high) + 1, size=dims).astype(dtype)
        else:  # bool
            out[tensor.name] = rng.integers(0, 2, size=dims).astype(bool)
    return out
