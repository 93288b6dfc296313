"""The model files of a quantization: the upload loaded and checked, the sizes that decide external data,
and the written output verified (or removed, so nothing stores a model that does not load)."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError
from onnx import ModelProto

from enginefarm.core.errors import BuildFailed
from enginefarm.graph.graphfacts import QDQ_OPS
from worker.rewrite.onnxgraph import all_nodes


def load_graph(model_path: Path) -> ModelProto:
    """Parse and check the float model (weights stay on disk); any failure is final for the build."""
    try:
        model = onnx.load(str(model_path), format="protobuf", load_external_data=False)
        onnx.checker.check_model(str(model_path))
    except FileNotFoundError:
        raise BuildFailed(f"model file {model_path} does not exist") from None
    except (DecodeError, OSError, ValueError, RuntimeError, UnicodeDecodeError, onnx.checker.ValidationError) as exc:
        raise BuildFailed(f"cannot quantize: the model does not load as ONNX ({exc})") from None
    if any(n.op_type in QDQ_OPS for n in all_nodes(model.graph)):
        raise BuildFailed("the model already holds QuantizeLinear/DequantizeLinear nodes; build int8 from it as it is")
    return model


def stored_bytes(model_path: Path, model: ModelProto) -> int:
    """Size on disk of the model file plus each external data file it names."""
    files = {entry.value for t in model.graph.initializer for entry in t.external_data if entry.key == "location"}
    return model_path.stat().st_size + sum(
        (model_path.parent / f).stat().st_size for f in files if (model_path.parent / f).is_file()
    )


def verify(out_path: Path) -> None:
    """The written file must pass the checker and open in ORT CPU; else remove it, so nothing stores it."""
    try:
        onnx.checker.check_model(str(out_path))
        ort.InferenceSession(str(out_path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        remove_model_files(out_path)
        raise BuildFailed(f"the quantized model does not load: {exc}") from None


def remove_model_files(path: Path) -> None:
    """Remove a model written here and its ``<name>.data`` file, whichever exist."""
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".data").unlink(missing_ok=True)
