"""Through the real farm: an ONNX Runtime artifact built from an external-data bundle loads from its downloaded bytes
alone, and specs whose input tensors no worker should allocate are refused when they are submitted."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec
from tests.corpus.files import external_bundle
from tests.helpers import unique_name

CPU = "onnxruntime/cpu-x86_64"
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}


def run(path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


def test_an_external_data_bundle_builds_an_onnxruntime_artifact_that_loads_from_its_bytes_alone(farm, tmp_path):
    """Before: a 441-byte artifact that still read weights.bin; its own check failed ("External data path does not
    exist") and it was catalogued and served all the same."""
    bundle = external_bundle()
    with Client(farm.url) as c:
        model, _ = c.upload(bundle, unique_name("extdata"))
        build = c.build(model["id"], [CPU], {**sample_spec(), "benchmark": QUICK})
        done = c.wait_build(build["id"], timeout=300, poll=0.3)
        (task,) = done["tasks"]
        assert task["state"] == "succeeded", task
        report = c.wait_checks(model["id"], timeout=180)
        deploy = tmp_path / "deploy"  # nothing but the downloaded bytes
        deploy.mkdir()
        c.download(task["engine_id"], deploy / "model.onnx")
    (row,) = [r for r in report["rows"] if r["target"] == CPU]
    assert row["status"] == "measured" and row["accuracy"]["pass"] is True, row
    assert sorted(p.name for p in deploy.iterdir()) == ["model.onnx"]

    source = tmp_path / "source"
    zipfile.ZipFile(io.BytesIO(bundle)).extractall(source)
    x = np.random.default_rng(5).standard_normal((4, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(run(deploy / "model.onnx", x), run(source / "model.onnx", x), atol=1e-5, rtol=1e-4)


def five_inputs() -> bytes:
    """x0..x4, float32, each 2-D with dims of its own (the shapes of the 32 GiB spec), summed."""
    vi = helper.make_tensor_value_info
    names = [f"x{i}" for i in range(5)]
    graph = helper.make_graph(
        [helper.make_node("Sum", names, ["y"])],
        "five",
        [vi(n, TensorProto.FLOAT, [f"{n}_rows", f"{n}_cols"]) for n in names],
        [vi("y", TensorProto.FLOAT, ["out_rows", "out_cols"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_input_tensors_over_the_limits_are_refused_naming_the_input_and_the_limit(api):
    """Before: 202, and the worker then tried to allocate 16 GiB for one copy of x0."""
    r = api.post("/v1/models", data={"name": unique_name("bounds")}, files={"file": ("m.onnx", five_inputs())})
    assert r.status_code == 201, r.text
    model_id = r.json()["id"]

    def build(shapes: dict) -> tuple[int, dict]:
        answer = api.post(
            "/v1/builds",
            json={
                "model_id": model_id,
                "targets": [CPU],
                "spec": {"shapes": shapes, "benchmark": {"enabled": False}, "accuracy": {"enabled": False}},
            },
        )
        return answer.status_code, answer.json()

    small = {f"x{i}": [1, 1] for i in range(5)}
    status, said = build({**small, "x0": [65536, 65536]})
    assert status == 422, said
    (problem,) = said["problems"]
    assert problem["loc"] == ["spec", "profiles", 0, "x0"], problem
    assert (
        "input 'x0' at 65536x65536 (profile 0's max shapes) is 4294967296 FLOAT elements, 16 GiB: over the "
        "limit of 1 GiB a tensor (ENGINEFARM_MAX_TENSOR_BYTES)"
    ) in problem["msg"], problem

    # Each input 1 GiB, within the limit a tensor; all five 5 GiB, over the limit for one set of inputs.
    status, said = build({f"x{i}": [16384, 16384] for i in range(5)})
    assert status == 422, said
    (problem,) = said["problems"]
    assert problem["loc"] == ["spec", "profiles", 0], problem
    assert (
        "the inputs at profile 0's max shapes take 5 GiB together ('x0' 1 GiB, 'x1' 1 GiB, 'x2' 1 GiB, 'x3' 1 GiB, "
        "'x4' 1 GiB): over the limit of 4 GiB for all inputs (ENGINEFARM_MAX_INPUTS_BYTES)"
    ) in problem["msg"]

    status, said = build({**small, "x0": [1024, 1024]})  # 4 MiB: accepted and built
    assert status == 202, said
