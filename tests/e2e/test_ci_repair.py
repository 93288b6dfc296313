"""``enginefarm ci --repair`` against the real farm, as a CI job runs it: the model with one layer whose range int8
cannot hold, calibrated from ``--samples``, passes with the repair as a check of its own (JUnit case, summary column,
the kept layer named), and ``enginefarm report`` prints the repair; a model whose layers the budget cannot hold
passes with the CPU form that passes as it is, saying so; a model whose repair cannot reach a passing gate fails the
run with the repair's reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from enginefarm.graph.samples import sample_spec
from tests.e2e.test_ci import junit_cases, run_ci
from tests.helpers import run_cli, unique_name
from tests.unit.worker.test_int8_vs_fp32 import _wide_add

CPU = "onnxruntime/cpu-x86_64"
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}


def _inputs(tmp_path: Path, seed: int, shifts: int = 1, **accuracy) -> tuple[Path, Path, Path]:
    model = _wide_add(tmp_path / f"wide-{seed}.onnx", seed=seed, shifts=shifts)
    npz = tmp_path / f"samples-{seed}.npz"
    np.savez(npz, input=np.random.default_rng(5).standard_normal((16, 3, 16, 16)).astype(np.float32))
    spec = tmp_path / f"spec-{seed}.json"
    body = {**sample_spec(image=16), "benchmark": QUICK, **({"accuracy": accuracy} if accuracy else {})}
    spec.write_text(json.dumps(body))
    return model, npz, spec


def _ci(farm, tmp_path: Path, name: str, inputs: tuple[Path, Path, Path], expect: int) -> tuple[str, dict, str]:
    model, npz, spec = inputs
    junit, summary = tmp_path / f"{name}.xml", tmp_path / f"{name}.md"
    out = run_ci(
        farm,
        model,
        name,
        "-t",
        CPU,
        "--precision",
        "int8",
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
    return out, junit_cases(junit), summary.read_text()


def test_ci_repair_passes_with_the_kept_layer_named_and_report_prints_it(farm, tmp_path):
    name = unique_name("ci-repair")
    out, cases, summary = _ci(farm, tmp_path, name, _inputs(tmp_path, 31), expect=0)
    assert "samples: 16 per input" in out, out
    assert "repair: pass: repaired: kept shift in fp32; cosine" in out, out
    case = cases[f"{CPU} repair"]
    assert case.find("failure") is None and "kept shift in fp32" in case.find("system-out").text
    assert set(cases) == {f"{CPU} {c}" for c in ("build", "repair", "benchmark", "accuracy", "latency_regression")}
    assert "| target | build | int8 repair | benchmark | accuracy | latency vs N-1 |" in summary, summary
    assert f"- `{CPU}` repair: repaired: kept shift in fp32" in summary, summary
    # int8 is slower than fp32 on this tiny network: the check passes, its reason says so and recommends fp32.
    assert "the repaired int8 is not faster than fp32 on this CPU" in summary and "(recommended: fp32)" in summary

    text = run_cli(farm.url, "report", name)
    assert "int8 accuracy repair of build" in text, text
    assert "repaired: kept shift in fp32; cosine" in text and "(fail) -> " in text and "(pass)" in text, text
    assert "sensitivity: the output's cosine against fp32" in text and " shift " in text, text
    assert "int8 without repair" in text and "not timed" in text, text
    assert "without repair: model " in text and "-int8-cpu-unrepaired-" in text, text


def test_ci_repair_fails_with_the_reason_when_no_set_within_the_budget_passes(farm, tmp_path):
    # A cosine no int8 artifact of this model reaches while any layer stays int8: the repair stops at its budget.
    name = unique_name("ci-repair-stop")
    out, cases, summary = _ci(farm, tmp_path, name, _inputs(tmp_path, 37, tolerances={"cosine": 1.0}), expect=1)
    assert "repair: fail: repair failed: no set of up to 1 of the " in out, out
    failure = cases[f"{CPU} repair"].find("failure")
    assert failure is not None and failure.get("type") == "repair"
    assert "build fp16 for this model" in failure.get("message"), failure.get("message")
    assert ": FAIL" in summary and f"- `{CPU}` repair: repair failed: no set of up to 1 of the " in summary, summary
    row = next(line for line in summary.splitlines() if line.startswith(f"| `{CPU}`"))
    assert row.split(" | ")[2] == "❌ fail", row  # the int8 repair column


def test_ci_repair_passes_by_form_where_no_set_within_the_budget_does(farm, tmp_path):
    # Four shifts in a row: a quarter of the layers cannot keep them all; int8 on the convolution alone passes.
    name = unique_name("ci-repair-form")
    out, cases, summary = _ci(farm, tmp_path, name, _inputs(tmp_path, 41, shifts=4), expect=0)
    assert "repair: pass: repaired by form: no set of up to " in out, out
    assert "the convolutions form passes as it is" in out, out
    assert cases[f"{CPU} repair"].find("failure") is None
    assert f"- `{CPU}` repair: repaired by form: " in summary, summary
    text = run_cli(farm.url, "report", name)
    assert "repaired by form: convolutions passes as it is" in text, text
