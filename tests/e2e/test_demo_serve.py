"""`make demo` / `enginefarm demo --serve` as a new user meets them: a taken port is one line and a non-zero exit
before anything is installed or built, and the whole demo prints one token, the one the dashboard takes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from server.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = re.compile(r"ef_[A-Za-z0-9_-]{20,}")
DEMO_TIMEOUT_S = 600


def demo_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")}


def listening() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1, as another program holding the demo's port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_taken_port_is_one_line_and_exit_2_before_the_demo_starts(tmp_path):
    with listening() as holder:
        port = holder.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "enginefarm",
                "demo",
                "--serve",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "data"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=demo_env(),
        )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == "" and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is in use" in lines[0], out.stderr
    suggested = int(re.search(r"--port (\d+)", lines[0]).group(1))
    assert suggested != port
    assert not (tmp_path / "data").exists()  # no catalog made, nothing built


def test_make_demo_on_a_taken_port_stops_before_installing_anything(tmp_path):
    with listening() as holder:
        port = holder.getsockname()[1]
        out = subprocess.run(
            [
                "make",
                "--no-print-directory",
                "demo",
                f"PORT={port}",
                f"DEMO_VENV={tmp_path / 'venv'}",
                f"PYTHON={sys.executable}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=demo_env(),
        )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[0].startswith(
        f"port {port} on 127.0.0.1 is in use; choose another, e.g. make demo PORT="
    ), out.stderr
    assert not (tmp_path / "venv").exists()


def test_the_served_demo_prints_one_token_and_the_dashboard_takes_it(tmp_path):
    """As `make demo` runs it: no --data-dir. One port from the start, the lines that point a shell's CLI at the
    farm, one token; the data folder it made is gone once it stops."""
    port = free_port()
    (tmp_path / "tmp").mkdir()
    log = tmp_path / "stdout.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "enginefarm",
                "demo",
                "--serve",
                "--port",
                str(port),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**demo_env(), "TMPDIR": str(tmp_path / "tmp")},  # where its data folder goes
        )
    try:
        deadline = time.monotonic() + DEMO_TIMEOUT_S
        while "ENGINEFARM_TOKEN=" not in (text := log.read_text(errors="replace")):
            assert proc.poll() is None, f"the demo ended with {proc.returncode}:\n{text[-3000:]}"
            assert time.monotonic() < deadline, f"the demo did not serve within {DEMO_TIMEOUT_S} s:\n{text[-3000:]}"
            time.sleep(1)
        assert f"ENGINEFARM_UI=http://127.0.0.1:{port}/ui" in text
        assert f"farm up at http://127.0.0.1:{port} " in text  # the demo's own farm ran on that port too
        assert re.search(rf"^export ENGINEFARM_API_URL=http://127.0.0.1:{port}$", text, re.M), text[-2000:]
        bin_dir = Path(sys.executable).parent
        assert f'export PATH="{bin_dir}:$PATH"' in text or shutil.which("enginefarm") == str(bin_dir / "enginefarm")
        data = Path(re.search(r"^data: (\S+)", text, re.M).group(1))
        assert data.parent == tmp_path / "tmp" and (data / "catalog.db").exists()
        assert re.search(rf"^export ENGINEFARM_DATA_DIR={re.escape(str(data))}$", text, re.M), text[-2000:]
        tokens = set(TOKEN.findall(text))
        assert len(tokens) == 1, tokens
        token = tokens.pop()
        assert re.search(rf"ENGINEFARM_TOKEN={token}$", text, re.M)
        # The demo's model is there for the one token, and the farm refuses a request without it.
        answer = httpx.get(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        assert answer.status_code == 200 and [m["name"] for m in answer.json()["items"]] == ["convnet"]
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert not data.exists() and f"removed the demo's data ({data})" in log.read_text(errors="replace")
