"""fp16 accuracy repair end to end, on real services: a model whose square leaves fp16's range on one branch, built
fp16 for the CPU and TensorRT-RTX. Without repair the CPU engine fails its accuracy check and no stage runs; with
``--repair`` the build's fp16 repair stage names that node, both targets keep it in fp32, the CPU engine passes, and
the API, ``build --wait``, ``enginefarm report`` and ``ci --repair`` say so. A model where three squares overflow
stops at the budget with the note recommending fp32, and ``ci --repair`` fails on it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from enginefarm.client import Client
from tests.e2e.test_ci import junit_cases, run_ci
from tests.helpers import run_cli, unique_name
from tests.unit.worker.test_fp16_repair import SHAPES, overflow_model, overflow_samples

CPU = "onnxruntime/cpu-x86_64"
GPU = "tensorrt-rtx/sm86"
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}


def _spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"shapes": SHAPES, "benchmark": QUICK}))
    return path


def _upload(farm, tmp_path: Path, branches: int, name: str) -> dict:
    npz = tmp_path / f"samples-{branches}.npz"
    np.savez(npz, input=overflow_samples(16))
    with Client(farm.url) as c:
        model, _ = c.upload(overflow_model(tmp_path / f"overflow-{branches}.onnx", branches, tag="-e2e"), name)
        return c.upload_samples(model["id"], npz)


def test_an_fp16_build_with_repair_keeps_the_overflowing_node_in_fp32_on_every_target(farm, api, tmp_path):
    name = unique_name("fp16-repair")
    model = _upload(farm, tmp_path, 1, name)
    body = {"model_id": model["id"], "targets": [CPU], "spec": {"shapes": SHAPES, "accuracy_repair": True}}
    # Only int8 and fp16 are repaired: fp32 is refused with the field named, before anything is queued.
    r = api.post("/v1/builds", json={**body, "spec": {**body["spec"], "precision": "fp32"}})
    assert r.status_code == 422 and r.json()["problems"][0]["loc"] == ["spec", "accuracy_repair"], r.text
    assert r.json()["problems"][0]["msg"].endswith("not to fp32"), r.text

    # Without repair: no stage, nothing kept, and the CPU engine fails its check (the square is infinite in fp16).
    with Client(farm.url) as c:
        plain = c.wait_build(c.build(model["id"], [CPU], {"precision": "fp16", "shapes": SHAPES})["id"], timeout=300)
    assert plain["quantize"] is None and plain["tasks"][0]["state"] == "succeeded", plain

    out = run_cli(
        farm.url,
        "build",
        str(model["id"]),
        "-t",
        CPU,
        "-t",
        GPU,
        "--precision",
        "fp16",
        "--repair",
        "--spec-file",
        str(_spec_file(tmp_path)),
        "--wait",
        "--timeout",
        "600",
    )
    build_id = int(out.split("build ")[1].split()[0])
    assert "fp16 repair: kept square in fp32; 100.00% (inf/NaN) -> 0.00% of output elements outside" in out, out
    assert "fp16 repair: measured on ONNX Runtime on the CPU" in out, out
    with Client(farm.url) as c:
        done = c.get(f"/v1/builds/{build_id}")
        stage = done["quantize"]
        assert done["spec"]["accuracy_repair"] is True and stage["kind"] == "fp16-repair"
        assert stage["state"] == "succeeded" and stage["keep_fp32_layers"] == ["square"], stage
        repair = stage["reports"]["onnxruntime"]["repair"]
        assert repair == stage["reports"]["tensorrt"]["repair"]  # found once, applied to every family
        assert repair["precision"] == "fp16" and repair["needed"] is True and repair["passed"] is True
        assert repair["kept"] == ["square"] and repair["ranking"][0]["layers"] == ["square"], repair
        assert repair["before"]["pass"] is False and repair["after"]["pass"] is True
        assert [t["state"] for t in done["tasks"]] == ["succeeded", "succeeded"], done["tasks"]
        # Each target's fp16 graph kept the node in fp32, as its build log says.
        for target in (CPU, GPU):
            log = run_cli(farm.url, "logs", str(build_id), "--target", target)
            assert "fp16 accuracy repair of this build: kept in fp32 square" in log, log
            assert "user-node 1 (Mul 1)" in log, log
        report = c.wait_checks(model["id"], timeout=300)
        engine = next(t["engine_id"] for t in done["tasks"] if t["target"] == CPU)
        view = c.get(f"/v1/engines/{engine}/fp16")
    by_engine = {r["engine_id"]: r for r in report["rows"] if r["target"] == CPU}
    assert by_engine[plain["tasks"][0]["engine_id"]]["accuracy"]["pass"] is False  # fp16 as converted fails
    assert by_engine[engine]["accuracy"]["pass"] is True, by_engine[engine]["accuracy"]  # repaired, it passes
    assert view["precision"] == "fp16" and view["build_id"] == build_id and view["candidates"] == []
    top = view["repair"]["ranking"][0]
    assert top["layers"] == ["square"] and top["kept"] is True and top["gain"] == 1.0 and top["ops"] == ["Mul"]
    assert view["repair"]["before"]["non_finite"] is True and view["repair"]["after"]["violations"] == 0.0
    assert view["repair"]["judged_on"] == CPU  # no onnxruntime/cuda target in this build: the CPU judged
    assert sorted(s["engine_id"] for s in report["fp16"]) == sorted(t["engine_id"] for t in done["tasks"])
    assert report["int8"] == []
    # The int8 view of an fp16 engine, and the fp16 view of the engine built without repair, are 404s.
    assert api.get(f"/v1/engines/{engine}/int8").status_code == 404
    assert api.get(f"/v1/engines/{plain['tasks'][0]['engine_id']}/fp16").status_code == 404

    text = run_cli(farm.url, "report", name)
    assert f"fp16 accuracy repair of build {build_id}" in text, text
    assert "repaired: kept square in fp32; outside the fp16 tolerance 100.00% (inf/NaN) (fail) -> 0.00% (pass)" in text
    assert "sensitivity: the share of output elements outside the fp16 tolerance" in text and " Mul " in text, text


def test_ci_repair_passes_an_fp16_model_it_repairs_and_fails_one_past_the_budget(farm, tmp_path):
    spec = _spec_file(tmp_path)
    runs = {}
    for branches, expect in ((1, 0), (3, 1)):
        npz = tmp_path / f"ci-samples-{branches}.npz"
        np.savez(npz, input=overflow_samples(16))
        name = unique_name(f"ci-fp16-{branches}")
        junit, summary = tmp_path / f"{name}.xml", tmp_path / f"{name}.md"
        out = run_ci(
            farm,
            overflow_model(tmp_path / f"ci-{branches}.onnx", branches, tag="-ci"),
            name,
            "-t",
            CPU,
            "--precision",
            "fp16",
            "--repair",
            "--samples",
            str(npz),
            "--spec-file",
            str(spec),
            "--timeout",
            "360",
            "--junit",
            str(junit),
            "--summary",
            str(summary),
            expect=expect,
        )
        runs[branches] = (out, junit_cases(junit), summary.read_text())
    out, cases, summary = runs[1]
    assert "repair: pass: repaired: kept square in fp32; 100.00% (inf/NaN) -> 0.00% of output elements" in out, out
    assert cases[f"{CPU} repair"].find("failure") is None
    assert "| target | build | fp16 repair | benchmark | accuracy | latency vs N-1 |" in summary, summary

    out, cases, summary = runs[3]
    assert "repair: fail: repair failed: no set of up to 2 of the 11 nodes converted to fp16" in out, out
    failure = cases[f"{CPU} repair"].find("failure")
    assert failure is not None and "build fp32 for this model" in failure.get("message"), failure
    row = next(line for line in summary.splitlines() if line.startswith(f"| `{CPU}`"))
    assert row.split(" | ")[2] == "❌ fail", row  # the fp16 repair column
