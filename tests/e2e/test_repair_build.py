"""int8 accuracy repair end to end: a model with one layer whose range int8 cannot hold, built int8 with
``--repair`` through the CLI, on real services: the quantize report names that layer, both target families keep it
in float, and the CPU engine now passes the accuracy check it failed before."""

from __future__ import annotations

import json

import numpy as np
import onnx

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec
from tests.helpers import run_cli, unique_name
from tests.unit.worker.test_int8_vs_fp32 import _wide_add

CPU = "onnxruntime/cpu-x86_64"
GPU = "tensorrt-rtx/sm86"
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}


def test_a_failing_int8_build_is_repaired_by_keeping_the_sensitive_layer_in_float(farm, api, tmp_path):
    path = _wide_add(tmp_path / "wide.onnx")
    npz = tmp_path / "samples.npz"
    np.savez(npz, input=np.random.default_rng(5).standard_normal((16, 3, 16, 16)).astype(np.float32))
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({**sample_spec(image=16), "benchmark": QUICK}))
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("repair"))
        model = c.upload_samples(model["id"], npz)
    # fp32 has nothing to repair: refused with the field named, before anything is queued.
    r = api.post(
        "/v1/builds",
        json={
            "model_id": model["id"],
            "targets": [CPU],
            "spec": {**sample_spec(image=16), "precision": "fp32", "accuracy_repair": True},
        },
    )
    assert r.status_code == 422 and "accuracy_repair applies to int8" in r.text and "not to fp32" in r.text, r.text

    out = run_cli(
        farm.url,
        "build",
        str(model["id"]),
        "-t",
        CPU,
        "-t",
        GPU,
        "--precision",
        "int8",
        "--repair",
        "--spec-file",
        str(spec_file),
        "--wait",
        "--timeout",
        "600",
    )
    build_id = int(out.split("build ")[1].split()[0])
    # The CLI shows what the int8 stage did: the CPU candidates measured, and the layer the repair kept.
    assert "int8 on the CPU: the candidates measured on the worker" in out, out
    assert "repair: kept shift in fp32; cosine" in out and "x one check of" in out, out
    with Client(farm.url) as c:
        done = c.get(f"/v1/builds/{build_id}")
        assert done["spec"]["accuracy_repair"] is True
        q = done["quantize"]
        repair = q["reports"]["onnxruntime"]["repair"]
        assert repair == q["reports"]["tensorrt"]["repair"]  # found once, applied to every family
        assert repair["needed"] is True and repair["passed"] is True and repair["kept"] == ["shift"], repair
        assert repair["before"]["pass"] is False and repair["before"]["cosine"] < 0.98 < repair["after"]["cosine"]
        assert "shift" in repair["ranking"][0]["layers"]
        for family in ("onnxruntime", "tensorrt"):
            assert "shift" in q["reports"][family]["options"]["kept_float"], q["reports"][family]["options"]
        # The TensorRT model has no Q/DQ in front of the Add, so TensorRT runs it in float.
        c.download_model(q["derived_models"]["tensorrt"], tmp_path / "trt.int8.onnx")
        report = c.wait_checks(model["id"], timeout=180)
    (row,) = [r for r in report["rows"] if r["target"] == CPU and r["precision"] == "int8"]
    assert row["accuracy"]["pass"] is True and row["accuracy"]["metrics"]["cosine"] > 0.99, row["accuracy"]
    graph = onnx.load(str(tmp_path / "trt.int8.onnx")).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    shift = next(n for n in graph.node if n.name == "shift")
    assert shift.op_type == "Add" and not dequantized.intersection(shift.input)
