"""Every model of the real-model corpus is what its registry entry says: a valid ONNX graph with the
declared inputs, shapes its build spec can cover, and samples on which ONNX Runtime gives finite outputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.realmodels import MODELS, path, samples


def _graph_inputs(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    init = {i.name for i in model.graph.initializer}
    return {i.name: i for i in model.graph.input if i.name not in init}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_matches_registry(name):
    entry = MODELS[name]
    file = path(name)
    assert file.stat().st_size < 30 << 20, "the corpus must stay small"
    model = onnx.load(str(file))
    onnx.checker.check_model(model)

    inputs = _graph_inputs(model)
    assert sorted(inputs) == sorted(entry.inputs), "declared input names differ from the graph's"
    opt = entry.opt_shapes()
    for key, info in inputs.items():
        tensor = info.type.tensor_type
        assert np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name == entry.inputs[key]
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim]
        if any(d is None for d in dims):
            assert key in opt, f"{key} has dynamic dims {dims} but no shapes in the spec"
        if key in opt:
            assert len(opt[key]) == len(dims), f"{key}: the spec's rank differs from the graph's"
            assert all(d in (None, s) for d, s in zip(dims, opt[key])), f"{key}: spec {opt[key]} vs graph {dims}"
    for profile in entry.shapes.get("profiles", []):
        for key, rng in profile.items():
            assert all(a <= b <= c for a, b, c in zip(rng["min"], rng["opt"], rng["max"])), key


@pytest.mark.parametrize("name", sorted(MODELS))
def test_samples_run_on_onnxruntime(name):
    entry = MODELS[name]
    feed = samples(name, count=2, seed=1)
    assert set(feed) == set(entry.inputs)
    for key, arr in feed.items():
        assert arr.dtype.name == entry.inputs[key], key
        low, high = entry.value_ranges[key]
        assert low <= arr.min() and arr.max() <= high, f"{key} outside {entry.value_ranges[key]}"
    again = samples(name, count=2, seed=1)
    assert all(np.array_equal(feed[k], again[k]) for k in feed), "samples must be deterministic for a seed"

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path(name)), options, providers=["CPUExecutionProvider"])
    for out in session.run(None, feed):
        assert out.size and np.isfinite(out).all()
