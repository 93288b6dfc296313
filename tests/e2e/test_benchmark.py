"""The benchmark stage end to end on real services: build → benchmark → accuracy → report → plot.

ONNX Runtime engines are measured on this machine's CPU by real worker processes; TensorRT-RTX engines
wait for a worker with a GPU that runs them, and say so.
"""

from __future__ import annotations

import io
import struct
import time

import numpy as np

from enginefarm.client import Client
from enginefarm.core.machine import Machine
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.helpers import run_cli, unique_name

CPU = "onnxruntime/cpu-x86_64"
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}


def _model(farm, tmp_path, seed: int, name: str | None = None, samples: bool = False):
    path = save_conv_net(tmp_path / f"m{seed}.onnx", seed=seed)
    with Client(farm.url) as c:
        model, _ = c.upload(path, name or unique_name("bench"))
        if samples:
            npz = tmp_path / "samples.npz"
            rng = np.random.default_rng(seed)
            np.savez(npz, input=rng.standard_normal((16, 3, 32, 32)).astype(np.float32))
            model = c.upload_samples(model["id"], npz)
    return model


def _build(c: Client, model_id: int, targets: list[str], **spec) -> dict:
    build = c.build(model_id, targets, {**sample_spec(), **spec})
    done = c.wait_build(build["id"], timeout=300, poll=0.2)
    assert {t["state"] for t in done["tasks"]} == {"succeeded"}, done["tasks"]
    return done


def _rows(report: dict, target: str) -> list[dict]:
    return [r for r in report["rows"] if r["target"] == target]


def test_cpu_engine_measured_with_trtexec_defaults_and_gpu_engine_pending(farm, tmp_path):
    model = _model(farm, tmp_path, seed=2121)  # bytes no other module builds: their engines would be rows here
    with Client(farm.url) as c:
        _build(c, model["id"], [CPU, "tensorrt-rtx/sm86"])
        report = c.wait_checks(model["id"], timeout=120)

        (cpu,) = _rows(report, CPU)
        assert cpu["status"] == "measured" and cpu["shape_key"] == "opt" and cpu["batch"] == 4
        stats = cpu["stats"]
        # trtexec's defaults: a 200 ms warm-up, then at least 3 s and at least 10 iterations.
        assert stats["warmup_s"] >= 0.2 and stats["warmup_iterations"] >= 1
        assert stats["wall_s"] >= 3.0 and stats["iterations"] >= 10
        assert abs(stats["throughput_qps"] - stats["iterations"] / stats["wall_s"]) < 1e-6
        lat, compute = cpu["latency_ms"], cpu["compute_ms"]
        assert lat["count"] == stats["iterations"]
        assert lat["min"] <= lat["median"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        assert compute["median"] <= lat["median"]  # compute is one phase of the end-to-end time
        assert stats["threads"] >= 1 and f"{stats['threads']} threads" in cpu["device"]
        # Same engine, same inputs: ONNX Runtime's graph rewrites move FP32 outputs by rounding only.
        acc = cpu["accuracy"]
        assert acc["pass"] is True and acc["metrics"]["cosine"] > 0.99999 and acc["metrics"]["max_abs"] < 1e-4
        assert "seeded random" in acc["inputs"]

        (gpu,) = _rows(report, "tensorrt-rtx/sm86")
        assert gpu["status"] == "pending"
        # The exact command that gets it measured on a machine that has the GPU.
        assert gpu["detail"] == (
            "benchmark pending: no worker with an sm86 GPU and tensorrt_rtx; a machine that has one measures it "
            f"with `enginefarm measure --engine {gpu['engine_id']}`"
        )
        engines = {e["target"]: e for e in c.engines(model=model["name"])["items"]}
        assert engines["tensorrt-rtx/sm86"]["checks"]["detail"] == gpu["detail"]
        assert engines[CPU]["checks"]["state"] == "succeeded" and engines[CPU]["accuracy_pass"] is True

        # The measurement keeps the fingerprint it was taken on.
        measured = c.get(f"/v1/engines/{cpu['engine_id']}/benchmarks")
        assert measured[0]["machine"]["platform"] == "x86_64" and measured[0]["machine"]["hostname"]
        # The check gate works in resolution: a CPU machine asking for accuracy=pass gets this engine.
        answer = c.resolve(model["name"], Machine(platform="x86_64"), accuracy="pass")
        assert answer["engine"]["id"] == cpu["engine_id"]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


def test_batch_sizes_report_plot_and_regression_through_the_cli(farm, tmp_path):
    name = unique_name("report")
    v1 = _model(farm, tmp_path, seed=31, name=name)
    spec = {"benchmark": {**QUICK, "batch_sizes": [1, 4, 8]}}
    with Client(farm.url) as c:
        _build(c, v1["id"], [CPU], **spec)
        c.wait_checks(v1["id"], timeout=120)
        v2 = _model(farm, tmp_path, seed=32, name=name)
        assert v2["version"] == "2"
        _build(c, v2["id"], [CPU], **spec)
        report = c.wait_checks(v2["id"], timeout=120)

    rows = _rows(report, CPU)
    assert [r["batch"] for r in rows] == [1, 4, 8] and [r["shape_key"] for r in rows] == [
        "batch=1",
        "batch=4",
        "batch=8",
    ]
    assert all(r["status"] == "measured" and r["stats"]["wall_s"] >= 0.3 for r in rows)
    assert report["previous"]["version"] == "1"
    for r in rows:  # version 2 against version 1, same target and shape
        reg = r["regression"]
        assert reg is not None and reg["previous_engine_id"] != r["engine_id"]
        assert abs(reg["median_ms_delta"] - (r["latency_ms"]["median"] - reg["median_ms"])) < 1e-9

    plot = tmp_path / "latency.png"
    out = run_cli(farm.url, "report", name, "--plot", str(plot))
    assert f"{name} version 2" in out and "batch 8" in out or "batch=8" in out
    assert "PASS" in out and f"{name} version 2 vs version 1" in out
    data = plot.read_bytes()
    width, height = _png_size(data)
    assert 600 <= width <= 4000 and 300 <= height <= 3000 and len(data) > 5000
    # The JSON form is the API's report.
    assert '"previous"' in run_cli(farm.url, "report", str(v2["id"]), "--json")


def test_int8_from_samples_builds_from_a_derived_qdq_model(farm, api, tmp_path):
    plain = _model(farm, tmp_path, seed=41)
    r = api.post(
        "/v1/builds", json={"model_id": plain["id"], "targets": [CPU], "spec": {**sample_spec(), "precision": "int8"}}
    )
    assert r.status_code == 422 and "calibration samples" in r.text

    model = _model(farm, tmp_path, seed=42, samples=True)
    assert model["samples"]["count"] == 16 and model["samples"]["arrays"]["input"]["shape"] == [16, 3, 32, 32]
    with Client(farm.url) as c:
        build = c.build(
            model["id"], [CPU, "tensorrt-rtx/sm86"], {**sample_spec(), "precision": "int8", "benchmark": QUICK}
        )
        assert build["quantize"]["state"] == "queued" and {t["state"] for t in build["tasks"]} == {"waiting"}
        assert build["tasks"][0]["status_detail"].startswith("waiting for the int8 quantization")
        done = c.wait_build(build["id"], timeout=300, poll=0.2)
        # TensorRT-RTX builds the derived Q/DQ model too (an int8 engine); ONNX Runtime runs it on the CPU.
        assert {t["state"] for t in done["tasks"]} == {"succeeded"}, done
        q = done["quantize"]
        assert q["state"] == "succeeded" and q["report"]["calibration_samples"] == 16
        derived = c.get(f"/v1/models/{q['derived_model_id']}")
        assert derived["source_model_id"] == model["id"] and derived["has_qdq"] and derived["name"] == model["name"]
        assert derived["version"].startswith(f"{model['version']}-int8-")
        report = c.wait_checks(model["id"], timeout=120)

    (row,) = _rows(report, CPU)
    assert row["precision"] == "int8" and row["status"] == "measured" and row["derived_from"] == model["id"]
    # One derived model per target family: the CPU engine comes from ONNX Runtime's own format.
    assert set(q["derived_models"]) == {"onnxruntime", "tensorrt"} and q["reports"]["onnxruntime"]["op_types"]
    assert q["derived_model_id"] == q["derived_models"]["tensorrt"]
    first = q["reports"]["onnxruntime"]["vs_fp32"]  # the quantize stage's own look, in the build's report
    assert first["fp32_median_ms"] > 0 and first["faster"] == (first["speedup"] > 1.0), first
    # Each CPU candidate that applies was measured on the worker, and the kept one is the model catalogued.
    candidates = q["reports"]["onnxruntime"]["candidates"]
    assert [c["name"] for c in candidates] == ["operator", "convolutions"], candidates  # a conv net, one MatMul
    (kept,) = [c for c in candidates if c["kept"]]
    assert kept["speedup"] == first["speedup"] and kept["why"], candidates
    assert q["reports"]["onnxruntime"]["options"]["recipe"] == kept["name"]
    # The benchmark stage timed the int8 CPU artifact against its fp32 sibling, interleaved, and kept both.
    vs = row["stats"]["vs_fp32"]
    assert vs["fp32_median_ms"] > 0 and vs["int8_median_ms"] > 0 and vs["faster"] == (vs["speedup"] > 1.0), vs
    assert vs["faster"] or vs["note"].startswith("int8 is not faster than fp32 here"), vs
    (gpu,) = _rows(report, "tensorrt-rtx/sm86")
    assert gpu["precision"] == "int8" and gpu["status"] == "pending"
    acc = row["accuracy"]
    # Judged against ONNX Runtime FP32 on the original model, on the user's samples.
    assert acc["reference"].startswith("onnxruntime fp32 on the original") and "16 user samples" in acc["inputs"]
    assert acc["pass"] is True and 0.99 < acc["metrics"]["cosine"] < 1.0 and acc["metrics"]["max_abs"] > 0, acc
    print(f"\nint8 vs fp32 on 16 samples: {acc['metrics']}")
    with Client(farm.url) as c:  # the int8 engine resolves under the model's own name
        answer = c.resolve(model["name"], Machine(platform="x86_64"), precision="int8")
        assert answer["engine"]["id"] == row["engine_id"]


def test_bad_samples_and_bad_benchmark_shapes_are_4xx(farm, api, tmp_path):
    model = _model(farm, tmp_path, seed=51)
    buf = io.BytesIO()
    np.savez(buf, image=np.zeros((2, 3, 32, 32), np.float32))
    r = api.post(f"/v1/models/{model['id']}/samples", files={"file": ("s.npz", buf.getvalue())})
    assert r.status_code == 422 and "'image' is not a model input" in r.text and "'input' has no array" in r.text
    r = api.post(f"/v1/models/{model['id']}/samples", files={"file": ("s.npz", b"not a zip")})
    assert r.status_code == 422 and ".npz" in r.text
    assert api.get(f"/v1/models/{model['id']}").json()["samples"] is None
    r = api.post(
        "/v1/builds",
        json={"model_id": model["id"], "targets": [CPU], "spec": {**sample_spec(), "benchmark": {"batch_sizes": [64]}}},
    )
    assert r.status_code == 422 and "outside the profile's batch range 1..8" in r.text
    r = api.post(
        "/v1/builds",
        json={
            "model_id": model["id"],
            "targets": [CPU],
            "spec": {**sample_spec(), "accuracy": {"tolerances": {"nope": 1}}},
        },
    )
    assert r.status_code == 422 and "unknown tolerance" in r.text


def test_sweep_marks_the_fastest_variant_that_passes_accuracy(farm, tmp_path):
    model = _model(farm, tmp_path, seed=61, samples=True)
    # int8 is held to an FP32 tolerance here, so it must fail the gate whatever its speed.
    base = {**sample_spec(), "benchmark": QUICK, "accuracy": {"tolerances": {"cosine": 0.99999}}}
    with Client(farm.url) as c:
        sweep = c.sweep(model["id"], [CPU], {"precision": ["fp32", "int8"], "optimization_level": [1, 3]}, base)
        assert sorted(v["variant"] for v in sweep["variants"]) == ["fp32 opt1", "fp32 opt3", "int8 opt1", "int8 opt3"]
        for v in sweep["variants"]:
            c.wait_build(v["build_id"], timeout=300, poll=0.2)
        c.wait_checks(model["id"], timeout=180)
        sweep = c.get(f"/v1/sweeps/{sweep['id']}")
    assert sweep["state"] == "done"
    cells = [(v["variant"], v["build_id"], e) for v in sweep["variants"] for e in v["engines"]]
    assert all(e["median_ms"] is not None for _, _, e in cells)
    assert {v: e["accuracy_pass"] for v, _, e in cells} == {
        "fp32 opt1": True,
        "fp32 opt3": True,
        "int8 opt1": False,
        "int8 opt3": False,
    }
    passing = [(e["median_ms"], b) for v, b, e in cells if e["accuracy_pass"]]
    assert sweep["best"][CPU] == min(passing)[1]
    assert [e["best"] for _, b, e in cells].count(True) == 1


def test_sweep_from_the_cli_takes_trtexec_flags_as_build_does(farm, tmp_path):
    """`enginefarm sweep ... --shapes=...` was "No such option": a model with dynamic inputs needed a spec file."""
    model = _model(farm, tmp_path, seed=62, samples=False)
    shapes = ["--minShapes=input:1x3x32x32", "--optShapes=input:2x3x32x32", "--maxShapes=input:4x3x32x32"]
    said = run_cli(farm.url, "sweep", str(model["id"]), "-t", CPU, "-a", "optimization_level=1,3", *shapes)
    assert "2 variant(s)" in said, said
    with Client(farm.url) as c:
        builds = c.builds(model_id=model["id"])
    profiles = [b["spec"]["profiles"] for b in builds]
    assert len(profiles) == 2 and all(
        p == [{"input": {"min": [1, 3, 32, 32], "opt": [2, 3, 32, 32], "max": [4, 3, 32, 32]}}] for p in profiles
    ), profiles


def test_benchmark_waits_for_a_capable_worker_then_one_takes_it(farm, tmp_path):
    target = "tensorrt-rtx/sm121"  # no other worker builds or benchmarks it
    model = _model(farm, tmp_path, seed=71)
    farm.start_worker("builder-121", [target], bench_targets=[])
    try:
        farm.wait_workers(["builder-121"])
        with Client(farm.url) as c:
            _build(c, model["id"], [target], benchmark=QUICK)
            (row,) = _rows(c.report(model["id"]), target)
            assert row["status"] == "pending" and row["detail"].startswith(
                "benchmark pending: no worker with an sm121 GPU and tensorrt_rtx; "
            )
            time.sleep(1.0)  # still waiting: nobody consumes bench.tensorrt-rtx.sm121
            assert _rows(c.report(model["id"]), target)[0]["detail"] == row["detail"]
    finally:
        farm.stop_process(farm.workers.pop("builder-121"))
    # A worker announcing that benchmark target takes the task. This machine has no GPU, so the run fails, and
    # says why: the routing is what is under test here.
    farm.start_worker("bencher-121", [], bench_targets=[target])
    try:
        with Client(farm.url) as c:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                engine = c.engines(model=model["name"])["items"][0]
                if engine["checks"]["state"] in ("failed", "succeeded"):
                    break
                time.sleep(0.3)
        assert engine["checks"]["state"] == "failed"
        assert "no CUDA driver" in engine["checks"]["detail"]
        assert engine["checks"]["worker_id"].startswith("bencher-121@")
    finally:
        farm.stop_process(farm.workers.pop("bencher-121"))


def test_wait_checks_waits_for_a_new_check_of_an_engine_measured_before(farm, tmp_path):
    """Checking an engine again with other settings (the engine is reused) is waited for, although the
    engine already has rows from its first check."""
    model = _model(farm, tmp_path, seed=33)
    with Client(farm.url) as c:
        _build(c, model["id"], [CPU], benchmark=QUICK)
        first = c.wait_checks(model["id"], timeout=120)
        assert {r["status"] for r in _rows(first, CPU)} == {"measured"}
        again = _build(c, model["id"], [CPU], benchmark={**QUICK, "batch_sizes": [1, 2]})
        assert again["tasks"][0]["reused"]
        report = c.wait_checks(model["id"], timeout=120)
    assert report["checks_in_progress"] == []
    assert {1, 2} <= {r["batch"] for r in _rows(report, CPU)}
