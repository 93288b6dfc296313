"""The calibration samples: checked against the model's inputs (names, dtypes, shapes, finite values), with
every problem named for the caller, and fed to the calibrator in batches along axis 0."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper
from onnxruntime.quantization import CalibrationDataReader

from enginefarm.core.errors import SpecInvalid

_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})


@dataclass(frozen=True)
class ModelInput:
    """A graph input as calibration needs it: name, element type and dims (int or None if dynamic)."""

    name: str
    elem_type: int
    dims: tuple[int | None, ...] | None  # None: the model gives no shape

    @property
    def splittable(self) -> bool:
        """Samples stack along axis 0 only where the model takes a variable or size-1 first dim."""
        if not self.dims:
            return False
        return self.dims[0] in (None, 1)


class SampleReader(CalibrationDataReader):
    """Feeds the samples to ORT's calibrator in batches along axis 0; whole arrays every batch."""

    def __init__(self, split: dict[str, np.ndarray], whole: dict[str, np.ndarray], count: int, batch: int):
        self._split, self._whole, self._count, self._batch = split, whole, count, batch
        self._starts: Iterator[int] = iter(())
        self.rewind()

    def get_next(self) -> dict[str, np.ndarray] | None:
        start = next(self._starts, None)
        if start is None:
            return None
        feed = {name: a[start : start + self._batch] for name, a in self._split.items()}
        feed.update(self._whole)
        return feed

    def rewind(self) -> None:
        self._starts = iter(range(0, self._count, self._batch))

    def set_range(self, start_index: int, end_index: int) -> None:
        """Feed only batches ``start_index`` to ``end_index`` (ONNX Runtime's strided calibration calls this)."""
        self._starts = iter(range(start_index * self._batch, min(end_index * self._batch, self._count), self._batch))

    def __len__(self) -> int:
        return -(-self._count // self._batch)

    def take(self, batches: int) -> list[dict[str, np.ndarray]]:
        """Return up to ``batches`` next batches; empty when the samples are used up."""
        out: list[dict[str, np.ndarray]] = []
        while len(out) < batches and (feed := self.get_next()) is not None:
            out.append(feed)
        return out


def problem(loc: list[Any], msg: str) -> dict[str, Any]:
    """One entry of a SpecInvalid's problems: where (``loc``) and what is wrong (``msg``)."""
    return {"loc": loc, "msg": msg}


def model_inputs(model: ModelProto) -> list[ModelInput]:
    """Return the graph inputs that need data (initializers listed as inputs have defaults)."""
    weights = {t.name for t in model.graph.initializer}
    inputs = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        if value.type.WhichOneof("value") != "tensor_type":
            inputs.append(ModelInput(value.name, TensorProto.UNDEFINED, None))
            continue
        ttype = value.type.tensor_type
        dims = None
        if ttype.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in ttype.shape.dim)
        inputs.append(ModelInput(value.name, ttype.elem_type, dims))
    return inputs


def _dims_text(dims: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _coerce(inp: ModelInput, value: Any, problems: list[dict[str, Any]]) -> np.ndarray | None:
    """Return the samples as a contiguous array of the input's dtype, or record why that is impossible."""
    loc = ["samples", inp.name]
    type_name = TensorProto.DataType.Name(inp.elem_type)
    try:
        target = np.dtype(helper.tensor_dtype_to_np_dtype(inp.elem_type))
    except (KeyError, TypeError, ValueError):
        problems.append(problem(loc, f"model input {inp.name!r} has type {type_name}, which calibration cannot feed"))
        return None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        problems.append(problem(loc, f"samples for input {inp.name!r} are not an array: {exc}"))
        return None
    if array.dtype == target:
        return _check_finite(inp, np.asarray(array, order="C"), problems)
    what = f"samples for input {inp.name!r} are {array.dtype}, and the model takes {type_name}"
    if array.dtype.kind not in "biuf":
        problems.append(problem(loc, f"{what}; give real numbers"))
        return None
    if inp.elem_type in _FLOAT_TYPES:
        with np.errstate(over="ignore", invalid="ignore"):
            return _check_finite(inp, np.asarray(array.astype(target), order="C"), problems)
    if array.dtype.kind == "f" and not (np.all(np.isfinite(array)) and np.array_equal(array, np.round(array))):
        problems.append(problem(loc, f"{what}; the values are not all whole numbers"))
        return None
    if target.kind in "iu":
        info = np.iinfo(target)
        if array.size and (array.min() < info.min or array.max() > info.max):
            problems.append(problem(loc, f"{what}; values fall outside {info.min}..{info.max}"))
            return None
    elif target.kind == "b" and array.size and not np.isin(array, (0, 1)).all():
        problems.append(problem(loc, f"{what}; only 0 and 1 convert to bool"))
        return None
    return np.asarray(array.astype(target), order="C")


def _check_finite(inp: ModelInput, array: np.ndarray, problems: list[dict[str, Any]]) -> np.ndarray | None:
    """Reject NaN and infinity: one of them would make every calibrated range meaningless."""
    if array.dtype.kind == "f" and array.size and not np.all(np.isfinite(array)):
        problems.append(problem(["samples", inp.name], f"samples for input {inp.name!r} contain NaN or infinity"))
        return None
    return array


def _shape_problem(inp: ModelInput, array: np.ndarray) -> str | None:
    """Why the samples' rank or fixed dims do not fit the input, or None; axis 0 of a splittable input counts
    samples, so it is free."""
    if inp.dims is None:
        return None
    shape = _dims_text(tuple(array.shape))
    if array.ndim != len(inp.dims):
        return (
            f"samples for input {inp.name!r} have rank {array.ndim} (shape {shape}), but the model takes rank "
            f"{len(inp.dims)} {_dims_text(inp.dims)}; stack samples along axis 0 of that shape"
        )
    if inp.splittable:
        if array.shape[0] == 0:
            return f"input {inp.name!r} has 0 calibration samples; give at least 1 along axis 0"
    elif inp.dims and inp.dims[0] is not None and array.shape[0] != inp.dims[0]:
        return (
            f"input {inp.name!r} has a fixed first dim of {inp.dims[0]}, so its samples cannot be split along "
            f"axis 0; give one array of shape {_dims_text(inp.dims)}, not {shape}"
        )
    for axis in range(1, len(inp.dims)):
        want = inp.dims[axis]
        if want is not None and array.shape[axis] != want:
            return (
                f"samples for input {inp.name!r} have shape {shape}, but the model fixes dim {axis} "
                f"to {want} {_dims_text(inp.dims)}"
            )
    return None


def validate(inputs: list[ModelInput], samples: Mapping[str, Any], calibration_batch: int) -> tuple[SampleReader, int]:
    """Check the samples against the model's inputs; return the reader and the sample count."""
    problems: list[dict[str, Any]] = []
    if not isinstance(samples, Mapping):
        raise SpecInvalid(
            "calibration samples must map input names to arrays",
            problems=[problem(["samples"], "not a mapping of input name to array")],
        )
    names = [i.name for i in inputs]
    for name in samples:
        if name not in names:
            msg = f"{name!r} is not an input of the model; its inputs are {', '.join(map(repr, names))}"
            problems.append(problem(["samples", str(name)], msg))
    arrays: dict[str, np.ndarray] = {}
    for inp in inputs:
        if inp.name not in samples:
            problems.append(problem(["samples", inp.name], f"no calibration samples for model input {inp.name!r}"))
            continue
        array = _coerce(inp, samples[inp.name], problems)
        if array is not None and (wrong := _shape_problem(inp, array)) is not None:
            problems.append(problem(["samples", inp.name], wrong))
        elif array is not None:
            arrays[inp.name] = array
    split = {i.name: arrays[i.name] for i in inputs if i.splittable and i.name in arrays}
    counts = {name: a.shape[0] for name, a in split.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{n!r}: {c}" for n, c in counts.items())
        msg = f"inputs hold different numbers of samples along axis 0 ({listed})"
        problems.append(problem(["samples"], msg))
    if problems:
        detail = "; ".join(p["msg"] for p in problems)
        raise SpecInvalid(f"calibration samples do not fit the model: {detail}", problems=problems)
    floats = [a for a in arrays.values() if a.dtype.kind == "f"]
    if floats and not any(a.any() for a in floats):
        raise SpecInvalid(
            "calibration samples are all zeros: every range would be empty; give real inputs",
            problems=[problem(["samples"], "every float input is all zeros")],
        )
    whole = {name: a for name, a in arrays.items() if name not in split}
    count = next(iter(counts.values()), 1)
    # A size-1 first dim pins the model's batch, so every input is fed one sample at a time.
    batch = 1 if any(i.dims and i.dims[0] == 1 for i in inputs if i.name in split) else calibration_batch
    return SampleReader(split, whole, count, batch), count
