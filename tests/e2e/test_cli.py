"""The CLI as a user meets it: models by name, trtexec's own flags, `ls builds`, one-line errors, `token create`
that will not make a catalog nobody uses, and `up --data-dir` printing the lines to export."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx

from enginefarm.client import Client
from enginefarm.graph.samples import save_conv_net
from tests.e2e.test_worker_lifecycle import ORT_TARGET, descendants, embedded_env, kill_leftovers, wait_gone
from tests.helpers import run_cli, unique_name


def test_build_by_name_with_trtexec_flags_then_ls_builds(farm, tmp_path):
    name = unique_name("cli")
    path = save_conv_net(tmp_path / "m.onnx", seed=611)
    run_cli(farm.url, "upload", str(path), "--name", name)
    out = run_cli(farm.url, "build", f"{name}:1", "-t", ORT_TARGET, "--minShapes", "input:1x3x32x32",
                  "--optShapes=input:4x3x32x32", "--maxShapes=input:8x3x32x32", "--builderOptimizationLevel=4",
                  "--trtexec-args", "--memPoolSize=workspace:512M --timingCacheFile=/tmp/t.cache", "--no-bench",
                  "--wait")
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
    bad = subprocess.run([sys.executable, "-m", "enginefarm", "--token", "ef_wrong", "ls", "models", "--api",
                          farm.url], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "HTTP 401" in bad.stderr and "Traceback" not in bad.stderr + bad.stdout
    assert len(bad.stderr.strip().splitlines()) <= 2, bad.stderr
    missing = run_cli(farm.url, "build", "no-such-model-x", "-t", ORT_TARGET, expect=1)
    assert "no model 'no-such-model-x'" in missing and "Traceback" not in missing
    # The fingerprint's own rules, as the API applies them, refuse a bad flag before any request.
    bad_cc = run_cli(farm.url, "fetch", "any", "--cc", "86", "--driver", "x", "-o", "e.plan", expect=1)
    assert "compute_capability: String should match pattern" in bad_cc and "driver_version" in bad_cc
    assert "Traceback" not in bad_cc


def test_token_create_will_not_start_a_catalog_nobody_uses(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | {
        "ENGINEFARM_DATA_DIR": str(tmp_path / "typo")}
    args = [sys.executable, "-m", "enginefarm", "token", "create", "--scope", "read", "--name", "ci"]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 1 and "no farm's catalog at" in refused.stderr and "--init" in refused.stderr
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
        proc = subprocess.Popen([sys.executable, "-m", "enginefarm", "up", "--port", "0", "--data-dir", str(data)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
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
        procs = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        assert not wait_gone(procs, 30)
    finally:
        kill_leftovers(procs | descendants(proc.pid))
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
