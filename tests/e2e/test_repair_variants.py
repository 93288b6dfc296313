"""The repaired int8 build and its failed original, end to end on real services: a model with one layer whose range
int8 cannot hold, built int8 with ``--repair`` for the CPU, and fp32 beside it. The unrepaired int8 model is a variant
of the build (its own derived model, in the model's history, with its failing cosine); the CPU latency of fp32, int8
without repair and int8 repaired comes from one run; and since int8 is slower than fp32 on this tiny network (its
quantize and dequantize steps cost more than the arithmetic they save), the build says so with the figures and
recommends fp32, and the resolver hands a machine that accepts both the fp32 engine."""

from __future__ import annotations

import json

import numpy as np

from enginefarm.client import Client
from enginefarm.core.machine import Machine
from enginefarm.graph.samples import sample_spec
from tests.helpers import run_cli, unique_name
from tests.unit.worker.test_int8_vs_fp32 import _wide_add

CPU = "onnxruntime/cpu-x86_64"
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}


def test_the_failed_original_is_a_variant_of_the_build_and_a_slower_repaired_int8_says_so(farm, tmp_path):
    name = unique_name("repair-variant")
    npz = tmp_path / "samples.npz"
    np.savez(npz, input=np.random.default_rng(5).standard_normal((16, 3, 16, 16)).astype(np.float32))
    spec = {**sample_spec(image=16), "benchmark": QUICK}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    with Client(farm.url) as c:
        model, _ = c.upload(_wide_add(tmp_path / "wide.onnx", seed=23), name)
        model = c.upload_samples(model["id"], npz)
    out = run_cli(
        farm.url,
        *("build", str(model["id"]), "-t", CPU, "--precision", "int8", "--repair", "--spec-file", str(spec_file)),
        *("--wait", "--timeout", "600"),
    )
    build_id = int(out.split("build ")[1].split()[0])
    # build --wait prints the three latencies of one run, the variant kept, and the speed stop.
    assert "repair: CPU latency, median of one run: fp32 " in out, out
    assert " ms, int8 without repair " in out and "x), int8 repaired " in out, out
    assert "repair: int8 without repair kept as model " in out and "(cosine " in out and ", fail)" in out, out
    assert "repair: not faster than fp32: the repaired int8 is not faster than fp32 on this CPU" in out, out
    assert "(recommended: fp32)" in out, out

    with Client(farm.url) as c:
        # The int8 engines' own benchmarks end before the fp32 engine is built and benchmarked: the resolver ranks
        # by those separate runs, and two benchmarks sharing this machine's two cores could swap which is faster.
        c.wait_checks(model["id"], timeout=300)
        fp32_build = c.wait_build(c.build(model["id"], [CPU], spec)["id"], timeout=600)
        assert [t["state"] for t in fp32_build["tasks"]] == ["succeeded"], fp32_build
        done = c.get(f"/v1/builds/{build_id}")
        q = done["quantize"]
        repair = q["reports"]["onnxruntime"]["repair"]
        assert repair["passed"] is True and repair["kept"] == ["shift"], repair
        lat, speedup = repair["latency_ms"], repair["speedup"]
        assert lat["fp32"] > 0 and lat["unrepaired"] > 0 and lat["repaired"] > 0, repair
        for k in ("unrepaired", "repaired"):  # fp32's median over each int8's, from the one run
            assert abs(lat["fp32"] / lat[k] - speedup[k]) <= 0.02 * speedup[k] + 0.01, repair
        vs = q["reports"]["onnxruntime"]["vs_fp32"]  # the kept candidate's timing is the repaired figure
        assert (vs["fp32_median_ms"], vs["int8_median_ms"]) == (lat["fp32"], lat["repaired"]), (vs, lat)
        assert speedup["repaired"] < 1.0 and repair["faster_than_fp32"] is False and repair["recommend"] == "fp32"
        assert (
            f"{lat['repaired']:.4g} ms against {lat['fp32']:.4g} ms ({speedup['repaired']:.2f}x"
            in (repair["speed_note"])
        ), repair

        # The failed original: its own derived model, linked from the build, with its failing accuracy.
        link = repair["unrepaired"]
        original = c.get(f"/v1/models/{link['model_id']}")
        assert original["source_model_id"] == model["id"] and original["has_qdq"], original
        assert original["version"].startswith(f"{model['version']}-int8-cpu-unrepaired-")
        d = original["derivation"]
        assert d["variant"] == "unrepaired" and d["build_id"] == build_id and d["repaired_kept"] == ["shift"], d
        assert d["accuracy"]["pass"] is False and d["accuracy"]["cosine"] == repair["before"]["cosine"] < 0.98, d
        assert d["latency_ms"] == lat and d["vs_fp32"]["int8_median_ms"] == lat["unrepaired"], d
        assert link["accuracy"] == repair["before"] and link["recipe"] == "operator"
        # The model's history: the upload, the repaired CPU model and the failed original, one version's variants.
        history = {m["id"]: m for m in c.models(name=name)["items"]}
        assert {model["id"], q["derived_models"]["onnxruntime"], link["model_id"]} == set(history), history
        assert history[q["derived_models"]["onnxruntime"]]["derivation"]["options"]["kept_float"] == ["shift"]
        report = c.wait_checks(model["id"], timeout=300)

    # The report's int8 entry carries the variant and the three latencies.
    (stage,) = [s for s in report["int8"] if s["build_id"] == build_id]
    assert stage["repair"]["unrepaired"]["model_id"] == link["model_id"]
    assert stage["repair"]["unrepaired"]["accuracy"]["passed"] is False
    assert stage["repair"]["latency_ms"] == lat and stage["repair"]["faster_than_fp32"] is False
    text = run_cli(farm.url, "report", name)
    assert f"without repair: model {link['model_id']} version {link['version']}, cosine " in text, text
    assert "not faster than fp32: the repaired int8 is not faster" in text and "(recommended: fp32)" in text, text
    assert "│ int8 stage │ one run │" in text and "x without repair, " in text, text  # the one run's row

    # The resolver does not prefer the slower int8 over fp32: both measured on this CPU, the faster one wins.
    rows = {r["precision"]: r for r in report["rows"] if r["target"] == CPU}
    assert set(rows) == {"fp32", "int8"} and all(r["status"] == "measured" for r in rows.values()), rows
    assert rows["int8"]["stats"]["vs_fp32"]["faster"] is False, rows["int8"]["stats"]["vs_fp32"]
    with Client(farm.url) as c:
        answer = c.resolve(name, Machine(platform="x86_64"))
    assert answer["engine"]["id"] == rows["fp32"]["engine_id"], answer
    assert answer["ranked_by"].startswith("fastest measured on"), answer["ranked_by"]
