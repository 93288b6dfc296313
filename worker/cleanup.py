"""The graph as the builder gets it (``prepared_model``): inputs the spec fixes to a value become constants, and the
optional clean-up (``spec.graph_cleanup``) folds constants, infers shapes and removes dead nodes with onnxslim.

Together they turn what a builder cannot handle into what it can: a Silero VAD's LSTM sits inside an If on the
sample rate, which TensorRT-RTX cannot build; with ``sr`` fixed to 16000 and static shapes, onnxslim folds every If
away and the LSTM builds. A Q/DQ model is not folded: that would turn its quantized weights back into float ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from enginefarm.core.errors import BuildFailed
from enginefarm.core.spec import BuildSpec, GraphCleanup
from enginefarm.graph.graphfacts import QDQ_OPS
from worker.backends.base import BuildLog
from worker.rewrite.onnxgraph import INLINE_LIMIT, save_model


def prepared_model(model_path: Path, spec: BuildSpec, out_dir: Path, log: BuildLog) -> Path:
    """The model to build from: ``model_path`` itself, or its rewrite in ``out_dir``."""
    if spec.graph_cleanup is GraphCleanup.NONE and not spec.fixed_inputs:
        return model_path
    model = onnx.load(str(model_path))
    frozen = freeze_inputs(model, spec.fixed_inputs)
    if frozen:
        log.add(f"fixed inputs: {', '.join(frozen)} became constants; the engine does not take them")
    if spec.graph_cleanup is GraphCleanup.ONNXSLIM:
        model = _slim(model, spec, log)
    if not frozen and spec.graph_cleanup is GraphCleanup.NONE:
        return model_path
    out = out_dir / "model.prepared.onnx"
    save_model(model, out, external=model.ByteSize() > INLINE_LIMIT)
    return out


def freeze_inputs(model: onnx.ModelProto, values: dict) -> list[str]:
    """Turn each named graph input into an initializer holding its value; returns the names frozen (inputs the
    graph no longer has, as in a model derived from a frozen one, are skipped)."""
    frozen = []
    for value in list(model.graph.input):
        if value.name not in values:
            continue
        ttype = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(ttype.elem_type)
        dims = [d.dim_value for d in ttype.shape.dim]
        array = np.asarray(values[value.name], dtype=dtype)
        if array.ndim == 0 and dims and all(d > 0 for d in dims):
            array = np.full(dims, array, dtype=dtype)
        model.graph.input.remove(value)
        model.graph.initializer.append(numpy_helper.from_array(array, value.name))
        frozen.append(f"{value.name}={values[value.name]}")
    return frozen


def static_input_shapes(spec: BuildSpec) -> list[str]:
    """``name:d0,d1,…`` for every input the spec pins to one shape (a single profile with min == max)."""
    profiles = spec.normalized_profiles()
    if len(profiles) != 1:
        return []
    return [f"{name}:{','.join(map(str, rng.min))}" for name, rng in profiles[0].items() if rng.min == rng.max]


def _slim(model: onnx.ModelProto, spec: BuildSpec, log: BuildLog) -> onnx.ModelProto:
    import onnxslim

    if any(n.op_type in QDQ_OPS for n in model.graph.node):
        log.add("graph cleanup: skipped, the model holds Q/DQ nodes that constant folding would undo")
        return model
    before = len(model.graph.node)
    inputs = {v.name for v in model.graph.input}
    shapes = [s for s in static_input_shapes(spec) if s.rpartition(":")[0] in inputs]
    try:
        slim = onnxslim.slim(model, input_shapes=shapes or None)
    except Exception as exc:  # noqa: BLE001 - onnxslim raises what its passes raise
        raise BuildFailed(
            f"graph cleanup with onnxslim failed: {type(exc).__name__}: {exc}; build with graph_cleanup=none"
        ) from None
    static = f", static shapes {' '.join(shapes)}" if shapes else ""
    log.add(
        f"graph cleanup: onnxslim {onnxslim.__version__}: {before} -> {len(slim.graph.node)} nodes "
        f"(constant folding, shape inference, dead node removal{static})"
    )
    return slim
