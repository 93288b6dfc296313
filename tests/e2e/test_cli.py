"""The CLI as a user meets it: models by name, trtexec's own flags, `ls builds`, one-line errors, `token create`
that will not make a catalog nobody uses, `up --data-dir` printing the lines to export, and `fetch` writing a file
only under a name that says what it is."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import onnx
import pytest

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.e2e.test_worker_lifecycle import ORT_TARGET, descendants, embedded_env, kill_leftovers, wait_gone
from tests.helpers import run_cli, unique_name

SM86 = "tensorrt-rtx/sm86"


def test_build_by_name_with_trtexec_flags_then_ls_builds(farm, tmp_path):
    name = unique_name("cli")
    path = save_conv_net(tmp_path / "m.onnx", seed=611)
    run_cli(farm.url, "upload", str(path), "--name", name)
    out = run_cli(
        farm.url,
        "build",
        f"{name}:1",
        "-t",
        ORT_TARGET,
        "--minShapes",
        "input:1x3x32x32",
        "--optShapes=input:4x3x32x32",
        "--maxShapes=input:8x3x32x32",
        "--builderOptimizationLevel=4",
        "--trtexec-args",
        "--memPoolSize=workspace:512M --timingCacheFile=/tmp/t.cache",
        "--no-bench",
        "--wait",
    )
    build_id = int(re.search(r"build (\d+) queued", out)[1])
    with Client(farm.url, token=farm.token) as c:
        spec = c.job(build_id)["spec"]
    assert spec["optimization_level"] == 4 and spec["workspace_mib"] == 512 and spec["timing_cache"] is True
    assert spec["profiles"] == [{"input": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}}]
    listed = run_cli(farm.url, "ls", "builds", "--model", name, "--limit", "5")
    assert f"build {build_id} " in listed and listed.count("build ") == 1 and "succeeded" in listed
    # A flag trtexec has and the farm does not take is named, with the reason.
    refused = run_cli(farm.url, "build", name, "-t", ORT_TARGET, "--saveEngine=m.plan", expect=1)
    assert "--saveEngine: the farm stores the engine" in refused and "Traceback" not in refused


def test_one_line_errors_for_a_bad_token_and_an_unknown_model(farm):
    bad = subprocess.run(
        [sys.executable, "-m", "enginefarm", "--token", "ef_wrong", "ls", "models", "--api", farm.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "HTTP 401" in bad.stderr and "Traceback" not in bad.stderr + bad.stdout
    assert len(bad.stderr.strip().splitlines()) <= 2, bad.stderr
    # Without a token, the CLI says how a CLI user gives one, not only the HTTP header.
    bare = subprocess.run(
        [sys.executable, "-m", "enginefarm", "ls", "models", "--api", farm.url],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "ENGINEFARM_TOKEN"},
    )
    assert bare.returncode == 1 and "needs an API token with scope 'read'" in bare.stderr, bare.stderr
    assert "the CLI sends the token in ENGINEFARM_TOKEN or --token TOKEN (no ENGINEFARM_TOKEN is set)" in bare.stderr
    # --api before the command, where --token goes, reaches the same farm (it was "No such option: --api").
    before = subprocess.run(
        [sys.executable, "-m", "enginefarm", "--token", "ef_wrong", "--api", farm.url, "ls", "models"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "ENGINEFARM_API_URL"},
    )
    assert before.returncode == 1 and "HTTP 401" in before.stderr, before.stdout + before.stderr
    # --token after the command, where --api goes, is the farm's --token (it was "No such option: --token").
    for given in (["--token", "ef_wrong"], ["--token=ef_wrong"]):
        after = subprocess.run(
            [sys.executable, "-m", "enginefarm", "ls", "models", *given, "--api", farm.url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert after.returncode == 1 and "HTTP 401" in after.stderr, after.stdout + after.stderr
    missing = run_cli(farm.url, "build", "no-such-model-x", "-t", ORT_TARGET, expect=1)
    assert "no model 'no-such-model-x'" in missing and "Traceback" not in missing
    # The fingerprint's own rules, as the API applies them, refuse a bad flag before any request.
    bad_cc = run_cli(farm.url, "fetch", "any", "--cc", "86", "--driver", "x", "-o", "e.plan", expect=1)
    assert "compute_capability: a compute capability is major.minor, e.g. 8.6" in bad_cc
    assert "driver_version: a version of dotted numbers, e.g. 580.82.07" in bad_cc
    assert "Traceback" not in bad_cc


def test_token_create_will_not_start_a_catalog_nobody_uses(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | {
        "ENGINEFARM_DATA_DIR": str(tmp_path / "typo")
    }
    args = [sys.executable, "-m", "enginefarm", "token", "create", "--scope", "read", "--name", "ci"]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 1 and "no farm's catalog at" in refused.stderr and "--init" in refused.stderr
    assert not (tmp_path / "typo" / "catalog.db").exists()
    # The commands that read the catalog say the same in one line, not the database driver's traceback.
    for cmd in (["token", "list"], ["token", "revoke", "3"], ["gc", "--dry-run"]):
        other = subprocess.run(
            [sys.executable, "-m", "enginefarm", *cmd], capture_output=True, text=True, timeout=120, env=env
        )
        assert other.returncode == 1 and "no farm's catalog at" in other.stderr, (cmd, other.stderr[-2000:])
        assert "Traceback" not in other.stderr and len(other.stderr.strip().splitlines()) <= 3, cmd
    assert not (tmp_path / "typo" / "catalog.db").exists()
    made = subprocess.run([*args, "--init"], capture_output=True, text=True, timeout=120, env=env)
    assert made.returncode == 0 and made.stdout.strip().startswith("ef_"), made.stderr
    again = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)  # now a catalog is there
    assert again.returncode == 0 and again.stdout.strip().startswith("ef_"), again.stderr


def test_up_takes_a_data_dir_and_prints_the_lines_to_export(tmp_path):
    data = tmp_path / "farm-data"
    env = {k: v for k, v in embedded_env(tmp_path / "elsewhere").items() if k != "ENGINEFARM_DATA_DIR"}
    log = tmp_path / "up.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "enginefarm", "up", "--port", "0", "--data-dir", str(data)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    procs: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 180
        while "export ENGINEFARM_TOKEN=" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.3)
        text = log.read_text()
        url = re.search(r"^export ENGINEFARM_API_URL=(\S+)$", text, re.M)[1]
        token = re.search(r"^export ENGINEFARM_TOKEN=(ef_\S+)$", text, re.M)[1]
        r = httpx.get(f"{url}/v1/workers", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 200
        assert (data / "catalog.db").is_file() and not (tmp_path / "elsewhere" / "catalog.db").exists()
        # The printed lines alone are enough for the commands that read the catalog (token, gc).
        exports = dict(re.findall(r"^export (ENGINEFARM_\w+)=(\S+)$", text, re.M))
        assert exports["ENGINEFARM_DATA_DIR"] == str(data), exports
        bare = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | exports
        listed = subprocess.run(
            [sys.executable, "-m", "enginefarm", "token", "list"], capture_output=True, text=True, timeout=120, env=bare
        )
        assert listed.returncode == 0 and "enginefarm up" in listed.stdout, listed.stderr[-2000:]
        procs = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        assert not wait_gone(procs, 30)
    finally:
        kill_leftovers(procs | descendants(proc.pid))
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# ------------------------------------------------------------------ fetch writes only what the file name says


@pytest.fixture(scope="module")
def two_kinds(farm, tmp_path_factory):
    """A model built for tensorrt-rtx/sm86 (batch 1..8) and ONNX Runtime on the CPU: (name, engines by target,
    the fingerprint flags of an sm86 machine with the workers' TensorRT-RTX)."""
    path = save_conv_net(tmp_path_factory.mktemp("kinds") / "m.onnx", seed=612)
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("kinds"))
        done = c.wait_build(c.build(model["id"], [SM86, ORT_TARGET], sample_spec())["id"], timeout=300, poll=0.2)
        assert {t["state"] for t in done["tasks"]} == {"succeeded"}, done["tasks"]
        engines = {e["target"]: e for e in c.engines(model=model["name"])["items"]}
    flags = [
        "--cc",
        "8.6",
        "--trt-rtx",
        engines[SM86]["backend_version"],
        "--driver",
        "580.82.07",
        "--platform",
        "x86_64",
    ]
    return model["name"], engines, flags


def fetch_in(folder, url: str, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    """``enginefarm fetch ARGS`` run in ``folder`` (its own cache there too), as a user would."""
    folder.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"ENGINEFARM_CACHE_DIR": str(folder.parent / f"{folder.name}-cache")}
    out = subprocess.run(
        [sys.executable, "-m", "enginefarm", "fetch", *args, "--api", url],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=folder,
    )
    assert out.returncode == expect, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    return out


def test_an_onnx_model_is_never_written_under_a_plan_name(farm, two_kinds, tmp_path):
    name, engines, flags = two_kinds
    # Naming the backend asks for the ONNX Runtime model; the .plan name says a TensorRT engine: refused.
    out = fetch_in(tmp_path / "a", farm.url, name, *flags, "--backend", "onnxruntime", "-o", "x.plan", expect=1)
    assert out.stderr.strip().count("\n") == 0, out.stderr  # one line
    assert "not writing x.plan" in out.stderr and "x.onnx" in out.stderr and "onnxruntime/cpu-x86_64" in out.stderr
    assert list((tmp_path / "a").iterdir()) == []
    # The case: batch 64, outside every profile, from an sm86 machine. Whatever the farm answers (the CPU
    # model, or a 404 that says what would fit), nothing lands under the .plan name and the exit is not 0.
    fetch_in(tmp_path / "b", farm.url, name, *flags, "--shapes", "input:64x3x32x32", "-o", "x.plan", expect=1)
    assert list((tmp_path / "b").iterdir()) == []
    # A plan under a .onnx name is refused the same way.
    out = fetch_in(tmp_path / "c", farm.url, name, *flags, "--backend", "tensorrt-rtx", "-o", "x.onnx", expect=1)
    assert out.stderr.strip().count("\n") == 0 and "not writing x.onnx" in out.stderr and "x.plan" in out.stderr
    assert list((tmp_path / "c").iterdir()) == []


def test_fetch_names_the_file_by_what_it_is(farm, two_kinds, tmp_path):
    name, engines, flags = two_kinds
    fetch_in(tmp_path / "gpu", farm.url, name, *flags)  # no -o: named here, by what it is
    plan = tmp_path / "gpu" / f"{name}-tensorrt-rtx-sm86.plan"
    assert [p.name for p in (tmp_path / "gpu").iterdir()] == [plan.name]
    assert hashlib.sha256(plan.read_bytes()).hexdigest() == engines[SM86]["sha256"]
    (tmp_path / "cpu" / "into").mkdir(parents=True)
    fetch_in(tmp_path / "cpu", farm.url, name, *flags, "--backend", "onnxruntime", "-o", "into")  # a folder
    model = tmp_path / "cpu" / "into" / f"{name}-onnxruntime-cpu-x86_64.onnx"
    assert hashlib.sha256(model.read_bytes()).hexdigest() == engines[ORT_TARGET]["sha256"]
    assert onnx.load(str(model)).graph.node  # an ONNX model, as its name says
    # A name that claims no kind takes what the farm chose.
    fetch_in(tmp_path / "bin", farm.url, name, *flags, "-o", "engine.bin")
    assert (tmp_path / "bin" / "engine.bin").read_bytes() == plan.read_bytes()


def test_allow_cpu_sends_accept_cpu(farm, two_kinds, tmp_path):
    """--allow-cpu asks for the CPU model on a GPU machine nothing of its runtime fits (batch 64): accept=cpu. The
    farm answers the ONNX Runtime model, which lands under its .onnx name; without it, a one-line 404 that says
    how to build what would fit, and no file."""
    name, engines, flags = two_kinds
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "enginefarm",
            "fetch",
            name,
            *flags,
            "--shapes",
            "input:64x3x32x32",
            "--allow-cpu",
            "--api",
            farm.url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=os.environ | {"ENGINEFARM_CACHE_DIR": str(tmp_path / ".cache")},
    )
    written = tmp_path / f"{name}-onnxruntime-cpu-x86_64.onnx"
    assert out.returncode == 0, out.stderr
    assert hashlib.sha256(written.read_bytes()).hexdigest() == engines[ORT_TARGET]["sha256"]
    # Without it, the same machine is told no engine of its runtime fits, and what would.
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "enginefarm",
            "fetch",
            name,
            *flags,
            "--shapes",
            "input:64x3x32x32",
            "-o",
            "x.plan",
            "--api",
            farm.url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=os.environ | {"ENGINEFARM_CACHE_DIR": str(tmp_path / ".cache2")},
    )
    assert refused.returncode != 0 and not (tmp_path / "x.plan").exists()
    first, *reasons = refused.stderr.strip().splitlines()
    assert first.startswith("error: HTTP 404") and first.endswith("--shapes input:64x3x32x32 --build"), first
    assert any("accept=cpu (fetch --allow-cpu)" in r for r in reasons), reasons  # each engine's reason below it
