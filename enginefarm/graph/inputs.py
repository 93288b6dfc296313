"""The inputs an engine is benchmarked and checked with: the shapes to measure at, user samples (.npz)
checked against the model, and seeded random data where there are no samples."""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray
from onnx import TensorProto, helper

from enginefarm.core.domain import ModelInfo, TensorInfo
from enginefarm.core.errors import problem
from enginefarm.core.shapes import format_dims
from enginefarm.core.spec import DEFAULT_SHAPE_KEY, MAX_DIM, BenchmarkSpec, BuildSpec, fixed_input_shape
from enginefarm.measure.inputs import random_inputs

MAX_SAMPLE_ARRAYS = 64


def np_dtype(tensor: TensorInfo) -> np.dtype[Any]:
    """The numpy dtype of an ONNX tensor type name such as ``FLOAT`` or ``INT64``."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.DataType.Value(tensor.dtype)))
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"input {tensor.name!r} has type {tensor.dtype}, which has no numpy equivalent") from None


# --------------------------------------------------------------------------- shapes to measure at


@dataclass(frozen=True)
class ShapeSet:
    """One set of input shapes to benchmark at, and the key it is stored under."""

    key: str
    shapes: dict[str, list[int]]
    batch: int | None


def _static_dims(tensor: TensorInfo) -> list[int]:
    """The dims of an input without a dynamic axis, every one of which is then a positive int."""
    return [int(d) for d in tensor.dims if isinstance(d, int)]


def _static_shapes(info: ModelInfo) -> dict[str, list[int]]:
    return {t.name: _static_dims(t) for t in info.inputs if not t.dynamic_axes}


def _batch_of(shapes: dict[str, list[int]]) -> int | None:
    firsts = {dims[0] for dims in shapes.values() if dims}
    return firsts.pop() if len(firsts) == 1 else None


def opt_shape_set(spec: BuildSpec, info: ModelInfo) -> ShapeSet:
    """The first optimization profile's opt point (static inputs at their fixed dims)."""
    shapes = _static_shapes(info)
    profiles = spec.normalized_profiles()
    if profiles:
        shapes.update({name: list(rng.opt) for name, rng in profiles[0].items()})
    for name, value in spec.fixed_inputs.items():
        shapes.setdefault(name, fixed_input_shape(value))
    batch = _batch_of({n: d for n, d in shapes.items() if n not in spec.fixed_inputs})
    return ShapeSet(DEFAULT_SHAPE_KEY, shapes, batch)


def fixed_arrays(spec: BuildSpec, info: ModelInfo) -> dict[str, NDArray[Any]]:
    """The values of the inputs the spec fixes, as the reference model is fed them (the engine does not take them)."""
    by_name = {t.name: t for t in info.inputs}
    out: dict[str, NDArray[Any]] = {}
    for name, value in spec.fixed_inputs.items():
        tensor = by_name[name]
        array = np.asarray(value, dtype=np_dtype(tensor))
        if array.ndim == 0 and tensor.dims and not tensor.dynamic_axes:
            array = np.full(_static_dims(tensor), array)
        out[name] = array
    return out


def shape_sets(spec: BuildSpec, info: ModelInfo) -> list[ShapeSet]:
    """Where to measure: the spec's explicit shapes, its batch sizes, or the opt shapes."""
    bench: BenchmarkSpec = spec.benchmark
    default = opt_shape_set(spec, info)
    opt = default.shapes
    if bench.shapes:
        out = []
        for given in bench.shapes:
            shapes = {**opt, **{k: list(v) for k, v in given.items()}}
            key = ",".join(f"{n}={format_dims(d)}" for n, d in sorted(given.items()))
            out.append(ShapeSet(key, shapes, _batch_of(shapes)))
        return out
    if bench.batch_sizes:
        dynamic_batch = {t.name for t in info.inputs if 0 in t.dynamic_axes}
        return [
            ShapeSet(f"batch={b}", {n: ([b, *d[1:]] if n in dynamic_batch else d) for n, d in opt.items()}, b)
            for b in bench.batch_sizes
        ]
    return [default]


def benchmark_shape_problems(spec: BuildSpec, info: ModelInfo) -> list[dict[str, Any]]:
    """Every benchmark shape that the engine could not run: unknown inputs, wrong ranks, outside the profile."""
    problems: list[dict[str, Any]] = []
    by_name = {t.name: t for t in info.inputs}
    profiles = spec.normalized_profiles()
    ranges = profiles[0] if profiles else {}
    for i, given in enumerate(spec.benchmark.shapes):
        for name, dims in given.items():
            loc = ["spec", "benchmark", "shapes", i, name]
            tensor = by_name.get(name)
            if tensor is None:
                problems.append(problem(loc, f"unknown input {name!r} (model inputs: {', '.join(by_name)})"))
            elif len(dims) != len(tensor.dims):
                problems.append(
                    problem(loc, f"input {name!r} has rank {len(tensor.dims)}, shape {dims} has rank {len(dims)}")
                )
            elif any(d < 1 or d > MAX_DIM for d in dims):
                problems.append(problem(loc, f"input {name!r}: shape {dims} has a dim outside 1..{MAX_DIM}"))
            elif name in ranges and not all(
                lo <= d <= hi for lo, d, hi in zip(ranges[name].min, dims, ranges[name].max)
            ):
                rng = ranges[name]
                problems.append(
                    problem(
                        loc,
                        f"input {name!r}: shape {dims} is outside the profile (min {rng.min}, max {rng.max}); the "
                        "engine cannot run it",
                    )
                )
            elif name not in ranges and tensor.dims != dims:
                problems.append(problem(loc, f"input {name!r} is fixed at {tensor.dims}, not {dims}"))
    for b in spec.benchmark.batch_sizes:
        for tensor in info.inputs:
            if 0 not in tensor.dynamic_axes:
                continue
            batch_range = ranges.get(tensor.name)
            if batch_range and not batch_range.min[0] <= b <= batch_range.max[0]:
                problems.append(
                    problem(
                        ["spec", "benchmark", "batch_sizes"],
                        f"batch {b} is outside the profile's batch range {batch_range.min[0]}..{batch_range.max[0]} "
                        f"for input {tensor.name!r}",
                    )
                )
    return problems


# --------------------------------------------------------------------------- data


def timing_inputs(
    info: ModelInfo,
    shape: ShapeSet,
    samples: dict[str, NDArray[Any]] | None,
    seed: int,
    value_ranges: dict[str, tuple[float, float]] | None = None,
) -> tuple[dict[str, NDArray[Any]], str]:
    """The inputs one benchmark shape is timed with, and where they came from. The user's samples where every
    input's sample fits the shape (axis 0 of a dynamic batch taken or repeated to the batch size), as trtexec's
    --loadInputs; otherwise generated values within each input's range."""
    if samples:
        fitted: dict[str, NDArray[Any]] = {}
        dynamic = {t.name for t in info.inputs if 0 in t.dynamic_axes}
        for tensor in info.inputs:
            want, have = shape.shapes[tensor.name], samples.get(tensor.name)
            if have is None or have.ndim != len(want):
                break
            if tensor.name in dynamic and list(have.shape[1:]) == want[1:] and have.shape[0] > 0:
                reps = -(-want[0] // have.shape[0])
                fitted[tensor.name] = np.ascontiguousarray(np.concatenate([have] * reps)[: want[0]])
            elif list(have.shape) == want:
                fitted[tensor.name] = have
            else:
                break
        else:
            return fitted, "the uploaded samples"
    return random_inputs(info, shape.shapes, seed, value_ranges), "generated values within each input's range"


class SamplesInvalid(ValueError):
    def __init__(self, problems: list[dict[str, Any]]):
        super().__init__("; ".join(p["msg"] for p in problems))
        self.problems = problems


def _claimed_bytes(member: IO[bytes]) -> tuple[list[int], np.dtype[Any], int]:
    """An .npy member's shape, dtype and size in bytes as its header states them, read without its data."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
    else:  # 3.0 only adds UTF-8 field names, which no model input has
        raise ValueError(f".npy format version {version[0]}.{version[1]} is not read here; save with numpy.savez")
    return list(shape), dtype, int(np.prod(shape, dtype=object)) * dtype.itemsize


def _check_claimed_sizes(zf: zipfile.ZipFile, max_bytes: int) -> None:
    """Refuse arrays whose headers claim more than ``max_bytes`` before numpy allocates them: an array's size comes
    from its header, not from the bytes that follow, so a few bytes can claim terabytes."""
    problems, total = [], 0
    for entry in zf.infolist():
        name = entry.filename.removesuffix(".npy")
        with zf.open(entry) as member:
            shape, dtype, size = _claimed_bytes(member)
        total += size
        if size > max_bytes:
            problems.append(
                problem(
                    ["samples", name],
                    f"array {name!r} claims shape {shape} of {dtype}: {size} bytes, more than the {max_bytes} "
                    "bytes samples may unpack to; send fewer or smaller samples",
                )
            )
    if not problems and total > max_bytes:
        problems.append(
            problem(
                ["samples"],
                f"the arrays claim {total} bytes together, more than the {max_bytes} bytes samples may unpack to; "
                "send fewer samples",
            )
        )
    if problems:
        raise SamplesInvalid(problems)


def load_samples(source: Path | bytes, info: ModelInfo, max_bytes: int = 1 << 30) -> dict[str, NDArray[Any]]:
    """Read an ``.npz`` of samples (no pickles) and check it against the model's inputs.

    Each array holds one input; axis 0 stacks samples where the model's batch axis is dynamic. Raises
    SamplesInvalid listing every problem.
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    problems: list[dict[str, Any]] = []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            entries = zf.infolist()
            if len(entries) > MAX_SAMPLE_ARRAYS:
                raise SamplesInvalid([problem(["samples"], f"at most {MAX_SAMPLE_ARRAYS} arrays in a samples file")])
            unpacked = sum(e.file_size for e in entries)
            if unpacked > max_bytes:
                raise SamplesInvalid(
                    [problem(["samples"], f"samples unpack to {unpacked} bytes, more than {max_bytes}")]
                )
            _check_claimed_sizes(zf, max_bytes)
        arrays = dict(np.load(io.BytesIO(data), allow_pickle=False))
    except SamplesInvalid:
        raise
    # zipfile raises NotImplementedError for an unknown compression and RuntimeError for an encrypted member.
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
        raise SamplesInvalid([problem(["samples"], f"not a readable .npz file of plain arrays: {exc}")]) from None
    by_name = {t.name: t for t in info.inputs}
    for name in sorted(set(arrays) - set(by_name)):
        problems.append(
            problem(["samples", name], f"array {name!r} is not a model input (inputs: {', '.join(by_name)})")
        )
    for name, tensor in by_name.items():
        loc = ["samples", name]
        if name not in arrays:
            problems.append(problem(loc, f"input {name!r} has no array in the samples"))
            continue
        arr = arrays[name]
        if arr.ndim != len(tensor.dims):
            problems.append(
                problem(loc, f"input {name!r} has rank {len(tensor.dims)}, the array has shape {list(arr.shape)}")
            )
            continue
        if arr.size == 0:
            problems.append(problem(loc, f"input {name!r}: the array is empty"))
            continue
        for axis, (want, got) in enumerate(zip(tensor.dims, arr.shape)):
            if isinstance(want, int) and want > 0 and want != got:
                problems.append(problem(loc, f"input {name!r} axis {axis} is fixed at {want}, the array has {got}"))
        try:
            expected = np_dtype(tensor)
        except ValueError as exc:
            problems.append(problem(loc, str(exc)))
            continue
        if not np.can_cast(arr.dtype, expected, casting="same_kind"):
            problems.append(problem(loc, f"input {name!r} is {expected}, the array is {arr.dtype}"))
        else:
            arrays[name] = arr.astype(expected, copy=False)
            if name in info.index_ranges and arr.size:
                low, high = info.index_ranges[name]
                if arr.min() < low or arr.max() > high:
                    problems.append(
                        problem(
                            loc,
                            f"input {name!r} indexes a table of {high + 1} rows, so its values must be within "
                            f"{low}..{high}; the array holds {arr.min()}..{arr.max()}",
                        )
                    )
    counts = {
        arrays[t.name].shape[0] for t in info.inputs if t.name in arrays and 0 in t.dynamic_axes and arrays[t.name].ndim
    }
    if len(counts) > 1:
        problems.append(
            problem(["samples"], f"the arrays stack different numbers of samples along axis 0: {sorted(counts)}")
        )
    if problems:
        raise SamplesInvalid(problems)
    return arrays


def sample_batches(samples: dict[str, NDArray[Any]], info: ModelInfo, batch: int) -> list[dict[str, NDArray[Any]]]:
    """Split samples into feeds of ``batch`` along the dynamic batch axis (the rest is dropped).
    Inputs without a dynamic batch axis are passed whole in every feed."""
    dynamic = {t.name for t in info.inputs if 0 in t.dynamic_axes}
    n = min((samples[name].shape[0] for name in dynamic), default=1)
    if not dynamic:
        return [dict(samples)]
    count = max(n // batch, 1)
    size = batch if n >= batch else n
    return [
        {name: (arr[i * size : (i + 1) * size] if name in dynamic else arr) for name, arr in samples.items()}
        for i in range(count)
    ]
