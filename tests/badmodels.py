"""Models the farm accepts at upload but a backend refuses to build."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper


def custom_op_model(path: Path) -> Path:
    """A graph onnx.checker accepts (ops of unknown domains are not checked) but ONNX Runtime cannot load."""
    graph = helper.make_graph(
        [helper.make_node("FancyOp", ["x"], ["y"], domain="com.example", name="fancy")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
