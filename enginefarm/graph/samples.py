"""Small real ONNX models for the demo, the tests and the benchmarks (built with onnx.helper, no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11+; annotations only, and the graph still imports on 3.10


def conv_net(
    channels: int = 16, blocks: int = 2, image: int = 32, seed: int = 0, dynamic_batch: bool = True
) -> onnx.ModelProto:
    """A conv → relu stack ending in global pooling and a linear layer; ``channels`` sets the weight size."""
    rng = np.random.default_rng(seed)
    inits, nodes, prev, cin = [], [], "input", 3
    for i in range(blocks):
        w = (rng.standard_normal((channels, cin, 3, 3)) * (2 / (cin * 9)) ** 0.5).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"conv{i}.w"),
            numpy_helper.from_array(np.zeros(channels, np.float32), f"conv{i}.b"),
        ]
        nodes += [
            helper.make_node("Conv", [prev, f"conv{i}.w", f"conv{i}.b"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        prev, cin = f"r{i}", channels
    fc = (rng.standard_normal((channels, 10)) * 0.1).astype(np.float32)
    inits.append(numpy_helper.from_array(fc, "fc.w"))
    nodes += [
        helper.make_node("GlobalAveragePool", [prev], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1, name="flatten"),
        helper.make_node("MatMul", ["flat", "fc.w"], ["logits"], name="fc"),
    ]
    batch = "batch" if dynamic_batch else 1
    graph = helper.make_graph(
        nodes,
        "enginefarm_sample",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="enginefarm-samples", producer_version="1"
    )
    model.ir_version = 8  # readable by every runtime we target
    onnx.checker.check_model(model)
    return model


class ConvNetOptions(TypedDict, total=False):
    """``conv_net``'s parameters, as ``save_conv_net`` passes them on."""

    channels: int
    blocks: int
    image: int
    seed: int
    dynamic_batch: bool


def save_conv_net(path: Path, **kwargs: Unpack[ConvNetOptions]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(conv_net(**kwargs), str(path))
    return path


# A profile as a build spec's JSON gives it: per input, its "min", "opt" and "max" dims.
ProfileJson = dict[str, dict[str, list[int]]]


def sample_spec(batch: tuple[int, int, int] = (1, 4, 8), image: int = 32) -> dict[str, list[ProfileJson]]:
    """A build spec for ``conv_net``: one dynamic-batch profile."""
    lo, opt, hi = batch
    return {
        "profiles": [
            {"input": {"min": [lo, 3, image, image], "opt": [opt, 3, image, image], "max": [hi, 3, image, image]}}
        ]
    }
