"""The inputs an engine is benchmarked and checked with: the shapes to measure at, user samples (.npz)
checked against the model, and seeded random data where there are no samples."""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from enginefarm.domain import DEFAULT_SHAPE_KEY, MAX_DIM, BenchmarkSpec, BuildSpec, ModelInfo, TensorInfo

MAX_SAMPLE_ARRAYS = 64


def np_dtype(tensor: TensorInfo) -> np.dtype:
    """The numpy dtype of an ONNX tensor type name such as ``FLOAT`` or ``INT64``."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.DataType.Value(tensor.dtype)))
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"input {tensor.name!r} has type {tensor.dtype}, which has no numpy equivalent") from None


def dims_text(dims: list[int]) -> str:
    return "x".join(str(d) for d in dims)


# --------------------------------------------------------------------------- shapes to measure at


@dataclass(frozen=True)
class ShapeSet:
    """One set of input shapes to benchmark at, and the key it is stored under."""

    key: str
    shapes: dict[str, list[int]]
    batch: int | None


def _static_shapes(info: ModelInfo) -> dict[str, list[int]]:
    return {t.name: [int(d) for d in t.dims] for t in info.inputs if not t.dynamic_axes}


def _batch_of(shapes: dict[str, list[int]]) -> int | None:
    firsts = {dims[0] for dims in shapes.values() if dims}
    return firsts.pop() if len(firsts) == 1 else None


def opt_shape_set(spec: BuildSpec, info: ModelInfo) -> ShapeSet:
    """The first optimization profile's opt point (static inputs at their fixed dims)."""
    shapes = _static_shapes(info)
    profiles = spec.normalized_profiles()
    if profiles:
        shapes.update({name: list(rng.opt) for name, rng in profiles[0].items()})
    return ShapeSet(DEFAULT_SHAPE_KEY, shapes, _batch_of(shapes))


def shape_sets(spec: BuildSpec, info: ModelInfo) -> list[ShapeSet]:
    """Where to measure: the spec's explicit shapes, its batch sizes, or the opt shapes."""
    bench: BenchmarkSpec = spec.benchmark
    default = opt_shape_set(spec, info)
    opt = default.shapes
    if bench.shapes:
        out = []
        for given in bench.shapes:
            shapes = {**opt, **{k: list(v) for k, v in given.items()}}
            key = ",".join(f"{n}={dims_text(d)}" for n, d in sorted(given.items()))
            out.append(ShapeSet(key, shapes, _batch_of(shapes)))
        return out
    if bench.batch_sizes:
        dynamic_batch = {t.name for t in info.inputs if 0 in t.dynamic_axes}
        return [ShapeSet(f"batch={b}", {n: ([b, *d[1:]] if n in dynamic_batch else d) for n, d in opt.items()}, b)
                for b in bench.batch_sizes]
    return [default]


def benchmark_shape_problems(spec: BuildSpec, info: ModelInfo) -> list[dict]:
    """Every benchmark shape that the engine could not run: unknown inputs, wrong ranks, outside the profile."""
    problems: list[dict] = []
    by_name = {t.name: t for t in info.inputs}
    profiles = spec.normalized_profiles()
    ranges = profiles[0] if profiles else {}
    for i, given in enumerate(spec.benchmark.shapes):
        for name, dims in given.items():
            loc = ["spec", "benchmark", "shapes", i, name]
            tensor = by_name.get(name)
            if tensor is None:
                problems.append({"loc": loc, "msg": f"unknown input {name!r} (model inputs: {', '.join(by_name)})"})
            elif len(dims) != len(tensor.dims):
                problems.append({"loc": loc, "msg": f"input {name!r} has rank {len(tensor.dims)}, shape {dims} has rank {len(dims)}"})
            elif any(d < 1 or d > MAX_DIM for d in dims):
                problems.append({"loc": loc, "msg": f"input {name!r}: shape {dims} has a dim outside 1..{MAX_DIM}"})
            elif name in ranges and not all(lo <= d <= hi for lo, d, hi in zip(ranges[name].min, dims, ranges[name].max)):
                rng = ranges[name]
                problems.append({"loc": loc, "msg": f"input {name!r}: shape {dims} is outside the profile "
                                                    f"(min {rng.min}, max {rng.max}); the engine cannot run it"})
            elif name not in ranges and tensor.dims != dims:
                problems.append({"loc": loc, "msg": f"input {name!r} is fixed at {tensor.dims}, not {dims}"})
    for b in spec.benchmark.batch_sizes:
        for tensor in info.inputs:
            if 0 not in tensor.dynamic_axes:
                continue
            rng = ranges.get(tensor.name)
            if rng and not rng.min[0] <= b <= rng.max[0]:
                problems.append({"loc": ["spec", "benchmark", "batch_sizes"],
                                 "msg": f"batch {b} is outside the profile's batch range {rng.min[0]}..{rng.max[0]} "
                                        f"for input {tensor.name!r}"})
    return problems


# --------------------------------------------------------------------------- data


def random_inputs(info: ModelInfo, shapes: dict[str, list[int]], seed: int) -> dict[str, np.ndarray]:
    """Seeded random data within the declared shapes: standard normal floats, small non-negative integers
    (valid as indices), random booleans. The same seed gives the same inputs on every worker."""
    rng = np.random.default_rng(seed)
    out = {}
    for tensor in info.inputs:
        dims, dtype = shapes[tensor.name], np_dtype(tensor)
        if dtype.kind == "f":
            out[tensor.name] = rng.standard_normal(dims).astype(dtype)
        elif dtype.kind in "iu":
            out[tensor.name] = rng.integers(0, 8, size=dims).astype(dtype)
        elif dtype.kind == "b":
            out[tensor.name] = rng.integers(0, 2, size=dims).astype(bool)
        else:
            raise ValueError(f"input {tensor.name!r} has type {tensor.dtype}; random data is not defined for it")
    return out


class SamplesInvalid(ValueError):
    def __init__(self, problems: list[dict]):
        super().__init__("; ".join(p["msg"] for p in problems))
        self.problems = problems


def load_samples(source: Path | bytes, info: ModelInfo, max_bytes: int = 1 << 30) -> dict[str, np.ndarray]:
    """Read an ``.npz`` of samples (no pickles) and check it against the model's inputs.

    Each array holds one input; axis 0 stacks samples where the model's batch axis is dynamic. Raises
    SamplesInvalid listing every problem.
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    problems: list[dict] = []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            entries = zf.infolist()
            if len(entries) > MAX_SAMPLE_ARRAYS:
                raise SamplesInvalid([{"loc": ["samples"], "msg": f"at most {MAX_SAMPLE_ARRAYS} arrays in a samples file"}])
            unpacked = sum(e.file_size for e in entries)
            if unpacked > max_bytes:
                raise SamplesInvalid([{"loc": ["samples"], "msg": f"samples unpack to {unpacked} bytes, more than {max_bytes}"}])
        arrays = dict(np.load(io.BytesIO(data), allow_pickle=False))
    except SamplesInvalid:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise SamplesInvalid([{"loc": ["samples"], "msg": f"not a readable .npz file of plain arrays: {exc}"}]) from None
    by_name = {t.name: t for t in info.inputs}
    for name in sorted(set(arrays) - set(by_name)):
        problems.append({"loc": ["samples", name], "msg": f"array {name!r} is not a model input (inputs: {', '.join(by_name)})"})
    for name, tensor in by_name.items():
        if name not in arrays:
            problems.append({"loc": ["samples", name], "msg": f"input {name!r} has no array in the samples"})
            continue
        arr = arrays[name]
        if arr.ndim != len(tensor.dims):
            problems.append({"loc": ["samples", name], "msg": f"input {name!r} has rank {len(tensor.dims)}, the array has shape {list(arr.shape)}"})
            continue
        if arr.size == 0:
            problems.append({"loc": ["samples", name], "msg": f"input {name!r}: the array is empty"})
            continue
        for axis, (want, got) in enumerate(zip(tensor.dims, arr.shape)):
            if isinstance(want, int) and want > 0 and want != got:
                problems.append({"loc": ["samples", name], "msg": f"input {name!r} axis {axis} is fixed at {want}, the array has {got}"})
        try:
            expected = np_dtype(tensor)
        except ValueError as exc:
            problems.append({"loc": ["samples", name], "msg": str(exc)})
            continue
        if not np.can_cast(arr.dtype, expected, casting="same_kind"):
            problems.append({"loc": ["samples", name], "msg": f"input {name!r} is {expected}, the array is {arr.dtype}"})
        else:
            arrays[name] = arr.astype(expected, copy=False)
    counts = {arrays[t.name].shape[0] for t in info.inputs if t.name in arrays and 0 in t.dynamic_axes and arrays[t.name].ndim}
    if len(counts) > 1:
        problems.append({"loc": ["samples"], "msg": f"the arrays stack different numbers of samples along axis 0: {sorted(counts)}"})
    if problems:
        raise SamplesInvalid(problems)
    return arrays


def sample_batches(samples: dict[str, np.ndarray], info: ModelInfo, batch: int) -> list[dict[str, np.ndarray]]:
    """Split samples into feeds of ``batch`` along the dynamic batch axis (the rest is dropped).
    Inputs without a dynamic batch axis are passed whole in every feed."""
    dynamic = {t.name for t in info.inputs if 0 in t.dynamic_axes}
    n = min((samples[name].shape[0] for name in dynamic), default=1)
    if not dynamic:
        return [dict(samples)]
    count = max(n // batch, 1)
    size = batch if n >= batch else n
    return [{name: (arr[i * size:(i + 1) * size] if name in dynamic else arr) for name, arr in samples.items()}
            for i in range(count)]
