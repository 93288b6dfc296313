"""One build request for targets of different abilities: each target builds the nearest precision it can, says
so, and the engine records what it is; asked not to, the farm refuses the build as before."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from enginefarm.client import Client
from tests.helpers import unique_name

TURING, CPU = "tensorrt-rtx/sm75", "onnxruntime/cpu-x86_64"
SPEC = {
    "profiles": [{"x": {"min": [1, 16], "opt": [4, 16], "max": [8, 16]}}],
    "benchmark": {"enabled": False},
    "accuracy": {"enabled": False},
}


def _matmul_model(path) -> None:
    """x[N,16] @ W[16,8]: a GEMM, which TensorRT-RTX cannot compile in fp32 for Turing."""
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="proj")],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def test_turing_builds_fp16_where_it_cannot_build_fp32_and_the_cpu_builds_fp32(farm, tmp_path):
    _matmul_model(tmp_path / "gemm.onnx")
    farm.start_worker("turing", [TURING], bench_targets=[])
    try:
        farm.wait_workers(["turing"])
        with Client(farm.url) as c:
            model, _ = c.upload(tmp_path / "gemm.onnx", unique_name("gemm"))
            # Asked to build exactly fp32, the farm refuses before building, naming the target and why.
            strict = c.http.post(
                "/v1/builds",
                json={"model_id": model["id"], "targets": [TURING, CPU], "spec": {**SPEC, "precision_fallback": False}},
            )
            assert strict.status_code == 422, strict.text
            assert [p["loc"] for p in strict.json()["problems"]] == [["targets", TURING]]
            assert "FP32 GEMM is not supported" in strict.json()["problems"][0]["msg"]

            build = c.build(model["id"], [TURING, CPU], SPEC)
            tasks = {t["target"]: t for t in build["tasks"]}
            assert (tasks[CPU]["precision"], tasks[CPU]["precision_note"]) == ("fp32", None)
            assert tasks[TURING]["precision"] == "fp16"
            assert tasks[TURING]["precision_note"].startswith("built fp16 instead of fp32: ")
            assert "FP32 GEMM is not supported" in tasks[TURING]["precision_note"]

            done = c.wait_build(build["id"], timeout=300)
            assert all(t["state"] == "succeeded" for t in done["tasks"]), done
            engines = {t["target"]: c.get(f"/v1/engines/{t['engine_id']}") for t in done["tasks"]}
            assert engines[TURING]["precision"] == "fp16" and engines[CPU]["precision"] == "fp32"
            assert len({e["spec_hash"] for e in engines.values()}) == 1  # one request, one spec
            logs = c.get(f"/v1/builds/{build['id']}")["tasks"]
            assert any("built fp16 instead of fp32" in (t["log_tail"] or "") for t in logs if t["target"] == TURING)
    finally:
        farm.stop_process(farm.workers.pop("turing"))
