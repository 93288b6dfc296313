"""The optional graph clean-up before a build (``spec.graph_cleanup``): constant folding, shape inference and dead
node removal with onnxslim. A Q/DQ model is left as it is: folding would turn its quantized weights back into
float ones."""

from __future__ import annotations

from pathlib import Path

import onnx

from enginefarm.domain import BuildSpec, GraphCleanup
from enginefarm.errors import BuildFailed
from worker.backends.base import BuildLog

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
_INLINE_LIMIT = (1 << 31) - (64 << 20)  # a protobuf message cannot exceed 2 GiB


def cleaned_model(model_path: Path, spec: BuildSpec, out_dir: Path, log: BuildLog) -> Path:
    """The model to build from: ``model_path`` itself, or its onnxslim rewrite in ``out_dir``."""
    if spec.graph_cleanup is GraphCleanup.NONE:
        return model_path
    import onnxslim

    model = onnx.load(str(model_path))
    if any(n.op_type in _QDQ_OPS for n in model.graph.node):
        log.add("graph cleanup: skipped, the model holds Q/DQ nodes that constant folding would undo")
        return model_path
    before = len(model.graph.node)
    try:
        slim = onnxslim.slim(model)
    except Exception as exc:  # noqa: BLE001 - onnxslim raises what its passes raise
        raise BuildFailed(f"graph cleanup with onnxslim failed: {type(exc).__name__}: {exc}; "
                          "build with graph_cleanup=none") from None
    out = out_dir / "model.cleaned.onnx"
    large = slim.ByteSize() > _INLINE_LIMIT
    onnx.save_model(slim, str(out), save_as_external_data=large, location="model.cleaned.data" if large else None)
    log.add(f"graph cleanup: onnxslim {onnxslim.__version__}: {before} -> {len(slim.graph.node)} nodes "
            f"(constant folding, shape inference, dead node removal)")
    return out
