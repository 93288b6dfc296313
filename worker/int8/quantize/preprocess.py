"""ONNX Runtime's pre-processing of the model before calibration (symbolic and ONNX shape inference, graph
clean-up and constant folding), done in the work folder; or, where it fails, the model as uploaded staged
there."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import onnx
from onnxruntime.quantization.shape_inference import quant_pre_process

from enginefarm.core.errors import BuildFailed
from worker.int8.quantize.files import remove_model_files
from worker.rewrite.onnxgraph import save_model

log = logging.getLogger(__name__)


def preprocessed_model(model_path: Path, work: Path, large: bool) -> tuple[Path | None, str | None]:
    """Run ORT's shape inference and graph cleanup; return the result, or None and why it failed."""
    out = work / "preprocessed.onnx"
    # Symbolic shape inference needs sympy, and gives up on some dynamic models ("Incomplete symbolic
    # shape inference"); ONNX shape inference and the graph cleanup (constant folding) still help then.
    attempts = [True, False] if importlib.util.find_spec("sympy") is not None else [False]
    error = None
    for symbolic in attempts:
        (work / "preprocessed.onnx.data").unlink(missing_ok=True)  # onnx appends to an existing data file
        source = work / "symbolic.onnx" if symbolic else model_path
        try:
            if symbolic:
                _infer_symbolic_shapes(model_path, source, large)
            quant_pre_process(
                str(source),
                str(out),
                skip_symbolic_shape=True,
                save_as_external_data=large,
                all_tensors_to_one_file=True,
                external_data_location="preprocessed.onnx.data",
            )
            onnx.checker.check_model(str(out))
            return out, None
        except Exception as exc:  # noqa: BLE001 - any failure only means quantizing the raw model
            error = f"{type(exc).__name__}: {exc}"
            log.info("quantization pre-processing (symbolic shapes: %s) failed: %s", symbolic, error)
        finally:
            if symbolic:
                remove_model_files(source)
    log.warning("quantization pre-processing failed, quantizing the model as uploaded: %s", error)
    return None, error


def _infer_symbolic_shapes(model_path: Path, out: Path, large: bool) -> None:
    """Write the model with ONNX Runtime's symbolic shape inference applied to ``out``.

    These are the steps of ``SymbolicShapeInference.infer_shapes``, which ``quant_pre_process`` would call,
    but that one, when the inference stays incomplete, first saves the partial model as
    ``sym_shape_infer_temp.onnx`` (and a data file) in the process's current directory. Here an incomplete
    inference is only an exception, and nothing is written outside the work folder.
    """
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inference = SymbolicShapeInference(int_max=2**31 - 1, auto_merge=False, guess_output_rank=False, verbose=0)
    inference._preprocess(onnx.load(str(model_path)))
    complete = False
    while inference.run_:
        complete = inference._infer_impl()
    inference._update_output_from_vi()
    if not complete:
        raise RuntimeError("Incomplete symbolic shape inference")
    save_model(inference.out_mp_, out, external=large)


def stage_raw(model_path: Path, work: Path, large: bool) -> Path:
    """Copy the model into the work folder: calibration writes scratch files beside its input."""
    try:
        model = onnx.load(str(model_path))
    except Exception as exc:  # noqa: BLE001
        raise BuildFailed(f"cannot quantize: the model's weights do not load ({exc})") from None
    staged = work / "model.onnx"
    save_model(model, staged, external=large)
    return staged
