"""Calibration: the methods on offer, the checked options, and each quantized tensor's symmetric range
(amax) from ONNX Runtime's calibrators, collected chunk by chunk with bounded memory."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod
from onnxruntime.quantization.calibrate import EntropyCalibrater, MinMaxCalibrater, PercentileCalibrater

from enginefarm.errors import SpecInvalid
from enginefarm.worker.quantize.samples import SampleReader, problem

log = logging.getLogger(__name__)

METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
# Calibrators keep every batch's intermediate tensors until they merge them: merge every this many.
_CHUNK_BATCHES = 32
# ORT's entropy default (128 bins for 128 quantized bins) leaves one candidate threshold, the full
# range, which is MinMax again; 2048 bins is the histogram TensorRT's own entropy calibrator uses.
_ENTROPY_BINS = 2048
_ENTROPY_QUANTIZED_BINS = 128
_PERCENTILE_BINS = 2048
_PERCENTILE = 99.999


class _ListReader(CalibrationDataReader):
    """A few batches at a time for a calibrator, which holds all it reads until it merges them."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def check_options(method: str, calibration_batch: int) -> CalibrationMethod:
    """Return the calibration method ``method`` names; raise SpecInvalid naming every bad option."""
    problems = []
    calibrate = METHODS.get(method.lower()) if isinstance(method, str) else None
    if calibrate is None:
        msg = f"unknown calibration method {method!r}; use one of {', '.join(METHODS)}"
        problems.append(problem(["method"], msg))
    if isinstance(calibration_batch, bool) or not isinstance(calibration_batch, int) or calibration_batch < 1:
        msg = f"calibration_batch must be an integer >= 1, not {calibration_batch!r}"
        problems.append(problem(["calibration_batch"], msg))
    if problems:
        raise SpecInvalid("; ".join(p["msg"] for p in problems), problems=problems)
    return calibrate  # type: ignore[return-value]


def calibrated_amax(source: Path, tensors: Iterable[str], reader: SampleReader, calibrate: CalibrationMethod,
                    work: Path, large: bool) -> dict[str, float]:
    """Return each tensor's symmetric range (amax), collected chunk by chunk with bounded memory.

    Only FLOAT tensors whose type shape inference knows get a range; the others are left out.
    """
    common: dict[str, Any] = {"augmented_model_path": str(work / "augmented.onnx"),
                              "use_external_data_format": large, "symmetric": True}
    if calibrate == CalibrationMethod.Entropy:
        calibrator = EntropyCalibrater(str(source), None, num_bins=_ENTROPY_BINS,
                                       num_quantized_bins=_ENTROPY_QUANTIZED_BINS, **common)
    elif calibrate == CalibrationMethod.Percentile:
        calibrator = PercentileCalibrater(str(source), None, num_bins=_PERCENTILE_BINS, percentile=_PERCENTILE,
                                          **common)
    else:
        calibrator = MinMaxCalibrater(str(source), None, **common)
    wanted, base = set(tensors), calibrator.select_tensors_to_calibrate

    def select(model: ModelProto) -> tuple[set[str], dict[str, Any]]:
        _, infos = base(model)  # every tensor's value info, from shape inference
        constants = {t.name for t in model.graph.initializer}
        chosen = {name for name in wanted if name in infos and name not in constants
                  and infos[name].type.HasField("tensor_type")
                  and infos[name].type.tensor_type.elem_type == TensorProto.FLOAT}
        return chosen, infos

    calibrator.select_tensors_to_calibrate = select  # calibrate what gets Q/DQ, not every tensor
    chatter = io.StringIO()  # the histogram calibrators print their progress
    with contextlib.redirect_stdout(chatter):
        calibrator.augment_graph()
        calibrator.create_inference_session()
        reader.rewind()
        while feeds := reader.take(_CHUNK_BATCHES):
            calibrator.collect_data(_ListReader(feeds))
        ranges = calibrator.compute_data()
    log.debug("calibration: %s", chatter.getvalue().strip())
    reader.rewind()
    amax = {}
    for name, data in ranges.items():
        low, high = (float(np.max(np.abs(v))) for v in data.range_value)
        amax[name] = max(low, high)
    return amax
