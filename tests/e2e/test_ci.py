"""``enginefarm ci`` against the real farm, run as a CI job runs it: a good model exits 0, a model that fails to
build and a version whose latency regresses exit non-zero, the JUnit XML parses with one case per target × check,
and the Markdown summary names what failed with its numbers. Also the shipped CI templates parse."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from enginefarm.client import Client
from enginefarm.client.ci import wait_or_fail
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.badmodels import custom_op_model
from tests.helpers import unique_name

ROOT = Path(__file__).resolve().parents[2]
CPU = "onnxruntime/cpu-x86_64"
RTX = "tensorrt-rtx/sm86"  # built here, benchmarked nowhere: the farm has no sm86 GPU
UNSERVED = "tensorrt-rtx/sm121"  # no worker of the test farm builds it
CHECKS = ["build", "benchmark", "accuracy", "latency_regression"]
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")


def run_ci(farm, model: Path, name: str, *args: str, expect: int) -> str:
    """``enginefarm ci`` in a subprocess without a terminal, as a CI runner starts it; returns its output."""
    out = subprocess.run(
        [sys.executable, "-m", "enginefarm", "ci", str(model), "--name", name, *args, "--api", farm.url],
        capture_output=True,
        text=True,
        timeout=400,
        env=os.environ | {"TERM": "dumb"},
    )
    assert out.returncode == expect, out.stdout + out.stderr
    return out.stdout


def spec_file(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**sample_spec(), "benchmark": QUICK, **extra}))
    return path


def junit_cases(path: Path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert suite.get("tests") == str(len(cases))
    return {c.get("name"): c for c in cases}


def test_a_good_model_exits_0_with_one_junit_case_per_target_and_check(farm, tmp_path):
    model = save_conv_net(tmp_path / "good.onnx", seed=601)
    name = unique_name("ci-good")
    junit, summary = tmp_path / "out" / "junit.xml", tmp_path / "summary.md"
    summary.write_text("earlier step\n")  # a job summary file collects every step's: appended to, never replaced
    out = run_ci(
        farm,
        model,
        name,
        "-t",
        CPU,
        "-t",
        RTX,
        "--spec-file",
        str(spec_file(tmp_path)),
        "--timeout",
        "300",
        "--junit",
        str(junit),
        "--summary",
        str(summary),
        expect=0,
    )

    lines = out.splitlines()
    assert all(STAMP.match(line) for line in lines), out  # plain timestamped lines, no bars or escape codes
    assert "\x1b" not in out and "\r" not in out
    assert f"{name} version 1" in lines[1] and lines[1].endswith("uploaded")
    assert any(f"{CPU} benchmark: pass: measured" in line for line in lines)
    assert lines[-1].endswith("pending on hardware the farm lacks, counted as passed (pending=pass)")
    assert len(lines) == len(set(lines))  # one line per change, not one per poll

    cases = junit_cases(junit)
    assert sorted(cases) == sorted(f"{t} {c}" for t in (CPU, RTX) for c in CHECKS)
    assert not any(c.find("failure") is not None for c in cases.values())
    skipped = sorted(n for n, c in cases.items() if c.find("skipped") is not None)
    assert skipped == [f"{RTX} accuracy", f"{RTX} benchmark", f"{RTX} latency_regression"]
    assert "no worker with an sm86 GPU" in cases[f"{RTX} benchmark"].find("skipped").get("message")

    text = summary.read_text()
    assert text.startswith("earlier step\n### enginefarm ci: ")
    assert f"{name} version 1: PASS" in text and f"| `{CPU}` | ✅ pass | ✅ pass | ✅ pass | ✅ pass |" in text
    assert "latency baseline: none (first version)" in text

    # The same file again is the same model (same sha256): not a new version, and the gate still passes.
    again = run_ci(farm, model, name, "-t", CPU, "--spec-file", str(spec_file(tmp_path)), "--timeout", "300", expect=0)
    assert "already uploaded (same bytes): reused" in again and f"{name} version 1" in again


def test_a_model_that_fails_to_build_exits_1_and_junit_names_the_reason(farm, tmp_path):
    junit = tmp_path / "junit.xml"
    out = run_ci(
        farm,
        custom_op_model(tmp_path / "custom.onnx"),
        unique_name("ci-bad"),
        "-t",
        CPU,
        "--timeout",
        "300",
        "--junit",
        str(junit),
        "--pending",
        "fail",
        expect=1,
    )
    assert "gate: fail" in out and "ONNX Runtime could not load the model" in out
    cases = junit_cases(junit)
    assert sorted(cases) == sorted(f"{CPU} {c}" for c in CHECKS)
    failure = cases[f"{CPU} build"].find("failure")
    assert failure is not None and "ONNX Runtime could not load the model" in failure.get("message")
    assert all(cases[f"{CPU} {c}"].find("failure") is not None for c in CHECKS)

    # A spec the farm refuses up front gets the same report: the farm's reason on each target's build.
    out = run_ci(
        farm,
        tmp_path / "custom.onnx",
        unique_name("ci-refused"),
        "-t",
        CPU,
        "--precision",
        "fp9",
        "--junit",
        str(junit),
        expect=1,
    )
    failure = junit_cases(junit)[f"{CPU} build"].find("failure")
    assert failure.get("message").startswith("the farm refused the build: ") and "precision" in failure.get("message")


def test_a_target_no_worker_serves_ends_at_the_deadline_with_the_reason(farm, tmp_path):
    junit = tmp_path / "junit.xml"
    out = run_ci(
        farm,
        save_conv_net(tmp_path / "m.onnx", seed=602),
        unique_name("ci-unserved"),
        "-t",
        UNSERVED,
        "--spec-file",
        str(spec_file(tmp_path)),
        "--timeout",
        "3",
        "--junit",
        str(junit),
        expect=1,
    )
    assert f"{UNSERVED} build: pending: waiting: no live worker serves {UNSERVED}" in out
    failure = junit_cases(junit)[f"{UNSERVED} build"].find("failure")
    assert failure.get("message") == f"not done after 3 s: no live worker serves {UNSERVED}"

    # The helper `build --wait --timeout` uses: the same deadline, exit code 1, the reason in the log.
    lines: list[str] = []
    with Client(farm.url) as c:
        model, _ = c.upload(tmp_path / "m.onnx", unique_name("ci-unserved"))
        build = c.build(model["id"], [UNSERVED], sample_spec(), queue_without_worker=True)
        last, code = wait_or_fail(c, build, timeout=1, log=lines.append, poll=0.2)
    assert code == 1 and last["tasks"][0]["state"] == "queued"
    assert lines[-1] == f"build {build['id']} {UNSERVED}: not done after 1 s: waiting: no live worker serves {UNSERVED}"


def test_a_version_whose_latency_regresses_beyond_the_limit_exits_1(farm, tmp_path):
    name = unique_name("ci-slow")
    spec = str(spec_file(tmp_path))
    v1 = save_conv_net(tmp_path / "v1.onnx", channels=8, seed=603)
    run_ci(farm, v1, name, "-t", CPU, "--spec-file", spec, "--timeout", "300", expect=0)
    # Same inputs and outputs, twelve times the channels: far more work per inference.
    v2 = save_conv_net(tmp_path / "v2.onnx", channels=96, seed=603)
    summary, junit = tmp_path / "summary.md", tmp_path / "junit.xml"
    out = run_ci(
        farm,
        v2,
        name,
        "-t",
        CPU,
        "--spec-file",
        spec,
        "--timeout",
        "300",
        "--max-regression-pct",
        "50",
        "--summary",
        str(summary),
        "--junit",
        str(junit),
        expect=1,
    )
    assert f"{name} version 2" in out and f"{CPU} latency_regression: fail: latency regressed: median" in out

    cases = junit_cases(junit)
    failed = [n for n, c in cases.items() if c.find("failure") is not None]
    assert failed == [f"{CPU} latency_regression"]
    numbers = cases[f"{CPU} latency_regression"].find("failure").text
    assert '"previous_median_ms"' in numbers and '"change_pct"' in numbers

    text = summary.read_text()
    assert f"{name} version 2: FAIL" in text and "latency baseline: version 1" in text and "limit +50%" in text
    row = next(line for line in text.splitlines() if line.startswith(f"| `{CPU}`"))
    before, after, pct = re.search(r"❌ fail (\d+\.\d+) → (\d+\.\d+) ms \(\+(\d+\.\d)%\)", row).groups()
    assert float(after) > 1.5 * float(before) and float(pct) > 50
    assert re.search(
        rf"latency regressed: median {after} ms vs {before} ms in version 1 \(\+{pct}%, limit \+50%\)", text
    )


def test_the_ci_templates_parse_and_run_enginefarm_ci():
    action = yaml.safe_load((ROOT / "deploy/ci/github/action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    assert {"model", "name", "targets", "api-url", "token"} <= set(action["inputs"])
    steps = " ".join(json.dumps(s) for s in action["runs"]["steps"])
    assert "pip install" in steps and "enginefarm ci" in steps and "GITHUB_STEP_SUMMARY" in steps
    assert "actions/upload-artifact" in steps

    gitlab = yaml.safe_load((ROOT / "deploy/ci/gitlab/enginefarm-ci.yml").read_text())
    (job,) = [v for k, v in gitlab.items() if isinstance(v, dict) and "script" in v]
    assert "enginefarm ci" in " ".join(job["script"]) and job["artifacts"]["reports"]["junit"]
