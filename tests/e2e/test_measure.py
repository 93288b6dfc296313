"""`enginefarm measure` on a deploy machine: the light client, installed alone with its measure-ort extra in a fresh
Python 3.10 venv (a Jetson's), fetches the CPU artifact the farm hands it, times it with the farm's runner at the
shapes the farm measured, posts the figure, and the farm's resolve answer then shows it beside the farm's own."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from enginefarm.client import Client
from enginefarm.core.machine import Machine
from enginefarm.graph.samples import sample_spec, save_conv_net
from enginefarm.measure.ort_runner import cpu_name
from server.embedded import issue_token
from tests.helpers import python, run_cli, unique_name

CPU = "onnxruntime/cpu-x86_64"
QUICK = {"warmup_ms": 50, "duration_s": 0.5, "iterations": 10}


def run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def light_client(client_wheel, tmp_path_factory) -> Path:
    """A fresh Python 3.10 venv with `pip install 'enginefarm[measure-ort]'` and nothing else; its bin folder."""
    venv = tmp_path_factory.mktemp("measure") / "venv"
    assert run(python("3.10"), "-m", "venv", venv).returncode == 0
    installed = run(venv / "bin" / "python", "-m", "pip", "install", "-q", f"{client_wheel}[measure-ort]")
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = json.loads(run(venv / "bin" / "python", "-m", "pip", "list", "--format", "json").stdout)
    names = {p["name"].lower() for p in listed}
    assert {"onnxruntime", "numpy"} <= names and not names & {"onnx", "fastapi", "sqlalchemy", "celery"}, names
    return venv / "bin"


def test_the_light_client_measures_the_cpu_artifact_and_the_answer_shows_it(
    farm, dist_settings, light_client, tmp_path
):
    name = unique_name("measure")
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=91), name)
        build = c.wait_build(c.build(model["id"], [CPU], {**sample_spec(), "benchmark": QUICK})["id"], timeout=300)
        assert [t["state"] for t in build["tasks"]] == ["succeeded"], build
        c.wait_checks(model["id"], timeout=300)
        engine_id = build["tasks"][0]["engine_id"]
        farm_figure = next(m for m in c.measurements(engine_id, source="farm")["items"] if m["shape_key"] == "opt")
    env = os.environ | {
        "ENGINEFARM_TOKEN": issue_token(dist_settings, "measure-device", ["measure"]),
        "ENGINEFARM_CACHE_DIR": str(tmp_path / "cache"),
    }
    measure = [light_client / "enginefarm", "measure", name, "--allow-cpu", "--duration", "1", "--api", farm.url]
    out = run(*measure, "--json", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    said = json.loads(out.stdout)
    figure, recorded = said["measurement"], said["recorded"]
    assert recorded["source"] == "fleet" and recorded["runtime"] == "onnxruntime/CPUExecutionProvider", recorded
    assert figure["shapes"] == farm_figure["shapes"]  # at the shapes the farm measured: the figures compare
    assert recorded["cpu_name"] == cpu_name() and recorded["gpu_name"] is None
    # Checked against the farm's own fp32 reference outputs for the model's samples, with no fp32 pass of its own.
    checked = figure["accuracy"]
    assert checked["passed"] is True and recorded["accuracy_pass"] is True, checked
    assert "seeded random inputs (seed 0) at opt shapes" in checked["inputs"], checked
    assert checked["outputs"] and all(f["violations"] == 0.0 for f in checked["outputs"].values()), checked
    with Client(farm.url) as c:
        ref = c.get(f"/v1/engines/{engine_id}/reference")
    assert (ref["precision"], ref["limits"]["atol"], ref["sha256"]) == ("fp32", 1e-4, checked["reference"])
    # Measured apart, by another process on this machine: a figure of the same order as the farm's own.
    ratio = recorded["median_ms"] / farm_figure["median_ms"]
    print(f"fleet {recorded['median_ms']:.3f} ms / farm {farm_figure['median_ms']:.3f} ms = {ratio:.2f}")
    assert 0.2 < ratio < 5, ratio

    # The same machine again, as `fetch --measure`: a second figure, but still one machine of its class.
    fetch = [light_client / "enginefarm", "fetch", name, "--allow-cpu", "-o", tmp_path / "m-cpu.onnx", "--measure"]
    again = run(*fetch, "--api", farm.url, env=env)
    assert again.returncode == 0 and "posted as measurement" in again.stdout, again.stdout + again.stderr
    assert "accuracy passed against the farm's fp32 reference outputs" in again.stdout, again.stdout
    assert (tmp_path / "m-cpu.onnx").stat().st_size > 0
    with Client(farm.url) as c:
        listed = c.measurements(engine_id)
        answer = c.resolve(name, Machine(platform="x86_64", cpu_name=cpu_name()))
    fleet = [m for m in listed["items"] if m["source"] == "fleet"]
    assert len(fleet) == 2 and len({m["machine_id"] for m in fleet}) == 1, fleet
    assert [(c["device_class"], c["machines"]) for c in listed["fleet"]] == [(f"fleet:cpu:{cpu_name()}", 1)]
    # Resolve shows the farm's figure and the fleet's side by side for this machine's CPU.
    shown = {m["source"]: m for m in answer["measured"]}
    assert shown["farm"]["latency_ms"] == pytest.approx(farm_figure["median_ms"])
    assert shown["fleet"]["latency_ms"] == pytest.approx(fleet[-1]["median_ms"])
    assert shown["fleet"]["on"] == f"1 machine of the CPU {cpu_name()}"
    # The report shows it too: in its rows, and as a table of its own in the terminal.
    with Client(farm.url) as c:
        (row,) = [r for r in c.report(model["id"])["rows"] if r["engine_id"] == engine_id]
    assert [(f["label"], f["median_ms"]) for f in row["fleet"]] == [
        (f"1 machine of the CPU {cpu_name()}", pytest.approx(fleet[-1]["median_ms"]))
    ]
    assert "measured by the fleet (enginefarm measure)" in run_cli(farm.url, "report", name)


def test_measure_without_a_measure_token_says_what_it_needs(farm, dist_settings, light_client, tmp_path):
    name = unique_name("measure-ro")
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=92), name)
        c.wait_build(c.build(model["id"], [CPU], {**sample_spec(), "benchmark": QUICK})["id"], timeout=300)
    env = os.environ | {"ENGINEFARM_CACHE_DIR": str(tmp_path / "cache")}
    # Before the farm measured it, a dynamic input's shape is not known: the command says how to give it.
    early = run(light_client / "enginefarm", "measure", name, "--allow-cpu", "--no-post", "--api", farm.url, env=env)
    if early.returncode != 0:  # the farm's benchmark may have landed already
        assert "give its shape with --shapes input:<dims>" in early.stderr, early.stderr
    with Client(farm.url) as c:
        c.wait_checks(model["id"], timeout=300)
    env = os.environ | {
        "ENGINEFARM_TOKEN": issue_token(dist_settings, "read-device", ["read"]),
        "ENGINEFARM_CACHE_DIR": str(tmp_path / "cache"),
    }
    out = run(
        light_client / "enginefarm", "measure", name, "--allow-cpu", "--duration", "0.2", "--api", farm.url, env=env
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "needs 'measure'" in out.stderr and "Traceback" not in out.stderr, out.stderr
    offline = run(light_client / "enginefarm", "measure", name, "--allow-cpu", "--no-post", "--duration", "0.2",
                  "--api", farm.url, env=env)  # fmt: skip
    assert offline.returncode == 0 and "not posted" in offline.stderr, offline.stdout + offline.stderr
