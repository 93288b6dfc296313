"""Benchmark and accuracy inputs: value ranges read off the graph, the spec's ranges, the user's samples."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from enginefarm.core.domain import ModelInfo, TensorInfo
from enginefarm.graph.graphfacts import index_ranges, op_counts
from enginefarm.graph.inputs import ShapeSet, timing_inputs
from enginefarm.measure.inputs import random_inputs


def _embedding_graph(rows: int = 50):
    """input_ids -> Cast -> Gather(table[rows, 8]); a mask that reaches no Gather; a float input."""
    table = numpy_helper.from_array(np.zeros((rows, 8), np.float32), "table")
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["table", "ids32"], ["emb"]),
        helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["emb", "scale"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [table],
    )
    return graph


def _info(**index) -> ModelInfo:
    return ModelInfo(
        inputs=[
            TensorInfo("input_ids", "INT64", ["batch", "seq"]),
            TensorInfo("mask", "INT64", ["batch", "seq"]),
            TensorInfo("scale", "FLOAT", [1]),
        ],
        outputs=[TensorInfo("out", "FLOAT", [])],
        opset=17,
        ir_version=8,
        producer="t",
        size=1,
        index_ranges=index,
    )


def test_index_ranges_follow_casts_to_the_gather_table():
    graph = _embedding_graph(rows=50)
    assert index_ranges(graph) == {"input_ids": [0, 49]}
    assert op_counts(graph.node) == {"Cast": 2, "Gather": 1, "Mul": 1}


def test_generated_integers_stay_within_the_table_and_the_spec_ranges():
    """The regression: integers 0..7 went past a 2-row token-type table (``idx=6 must be within [-2,1]``)."""
    info = _info(input_ids=[0, 1])
    shapes = {"input_ids": [4, 256], "mask": [4, 256], "scale": [1]}
    data = random_inputs(info, shapes, seed=3)
    assert data["input_ids"].dtype == np.int64 and set(np.unique(data["input_ids"])) == {0, 1}
    assert set(np.unique(data["mask"])) <= {0, 1}
    ranged = random_inputs(info, shapes, seed=3, value_ranges={"scale": (2.0, 3.0), "mask": (5, 6)})
    assert 2.0 <= ranged["scale"][0] <= 3.0 and set(np.unique(ranged["mask"])) <= {5, 6}


def test_timing_uses_samples_that_fit_and_generates_otherwise():
    info = _info(input_ids=[0, 49])
    samples = {
        "input_ids": np.arange(3 * 16).reshape(3, 16) % 50,
        "mask": np.ones((3, 16), np.int64),
        "scale": np.ones(1, np.float32),
    }
    shape = ShapeSet("opt", {"input_ids": [8, 16], "mask": [8, 16], "scale": [1]}, 8)
    fed, origin = timing_inputs(info, shape, samples, seed=0)
    assert origin == "the uploaded samples"
    assert fed["input_ids"].shape == (8, 16) and np.array_equal(fed["input_ids"][3:6], samples["input_ids"])
    longer = ShapeSet("seq=32", {"input_ids": [8, 32], "mask": [8, 32], "scale": [1]}, 8)
    fed, origin = timing_inputs(info, longer, samples, seed=0)
    assert origin.startswith("generated") and fed["input_ids"].shape == (8, 32) and fed["input_ids"].max() <= 49


def test_samples_outside_the_table_they_index_are_refused():
    import io

    import pytest

    from enginefarm.graph.inputs import SamplesInvalid, load_samples

    buffer = io.BytesIO()
    np.savez(
        buffer, input_ids=np.full((2, 4), 50000, np.int64), mask=np.ones((2, 4), np.int64), scale=np.ones(1, np.float32)
    )
    with pytest.raises(
        SamplesInvalid,
        match=r"indexes a table of 50 rows, so its values must be within 0\.\.49; "
        r"the array holds 50000\.\.50000",
    ):
        load_samples(buffer.getvalue(), _info(input_ids=[0, 49]))
