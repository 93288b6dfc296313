"""A farm that fails to start says why: ``enginefarm up`` (and ``demo``, which shares the code) names the process
that failed and quotes that process's own error from its log, with the log's path, instead of its own traceback.

Real processes throughout: ``python -m enginefarm up`` as a user runs it, its API and worker processes as it starts
them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.embedded import Farm, embedded_env, free_port

ROOT = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last)"


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the farm's settings or an import path of its own, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_") and k != "PYTHONPATH"}
    return env | {"PYTHONUNBUFFERED": "1"} | extra


def up(*args: str, python: str = sys.executable, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=clean_env(**env))


# Runs argv as a terminal runs its foreground job: SIGINT at its default. A job started in the background (as a CI
# runner may start this suite) passes SIGINT on ignored, and Python then takes no Ctrl-C, by design.
FROM_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
)


def test_a_farm_runs_from_the_checkouts_root(tmp_path):
    """`python -m enginefarm up` in the checkout's root, as a new user first tries it: the folders are the
    packages, so the farm's processes (started as `python -m enginefarm`, in that folder) import them and serve."""
    import httpx

    port = free_port()
    data = tmp_path / "data"
    env = {**clean_env(), "PYTHONFAULTHANDLER": "1"}  # SIGABRT prints every thread's stack: where a stop hangs
    farm = subprocess.Popen(
        [sys.executable, "-c", FROM_A_TERMINAL, sys.executable, "-m", "enginefarm", "up", "--port", str(port)]
        + ["--data-dir", str(data), "--workers", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and farm.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert farm.poll() is None, farm.stdout.read() if farm.stdout else ""
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
    finally:
        # How the farm's process takes signals (masks in hex): SIGINT (bit 1) neither blocked nor ignored.
        status = Path(f"/proc/{farm.pid}/status")
        lines = status.read_text().splitlines() if status.exists() else []
        masks = {k: int(v, 16) for k, v in (ln.split(":\t") for ln in lines) if k in ("SigBlk", "SigIgn")}
        stopping = time.monotonic()
        farm.send_signal(signal.SIGINT)
        try:  # 0.5 s on a quiet machine
            farm.wait(timeout=60)
        except subprocess.TimeoutExpired:
            farm.send_signal(signal.SIGABRT)
            farm.wait()
    took = time.monotonic() - stopping
    said = farm.stdout.read() if farm.stdout else ""
    api_log = data / "api.log"
    api_said = api_log.read_text(errors="replace")[-4000:] if api_log.exists() else "(no api.log)"
    assert not (masks.get("SigIgn", 0) | masks.get("SigBlk", 0)) & 1 << (signal.SIGINT - 1), masks
    assert farm.returncode == 0, f"exit {farm.returncode} after {took:.1f} s: {said}\n{masks}\napi.log:\n{api_said}"


def test_a_taken_port_is_one_line_and_exit_2_before_anything_is_made(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = up("-m", "enginefarm", "up", "--port", str(port), "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert TRACEBACK not in done.stderr, done.stderr
    said = " ".join(done.stderr.split())
    assert f"error: enginefarm up: port {port} on 127.0.0.1 is in use; choose another" in said, said
    assert "enginefarm up --port" in said, said
    assert not (tmp_path / "data").exists()


def test_a_port_taken_after_the_check_is_the_apis_own_error(tmp_path):
    """The API's bind fails (the port was taken after `up` checked it, or by whoever starts a Farm on it): the
    API's own "address already in use" from its log, the port and the log's path."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with Farm(embedded_env(tmp_path), port=port, log_dir=tmp_path) as farm, pytest.raises(RuntimeError) as failed:
            farm.start_api(timeout=40)
    said = str(failed.value)
    assert f"the farm's API (enginefarm api on port {port}) exited with code" in said, said
    assert f"its log, {tmp_path / 'api.log'}, says:" in said, said
    assert "address already in use" in said.lower(), said
    assert f"port {port} on 127.0.0.1 is in use by another process" in said, said


def test_a_worker_that_keeps_failing_ends_the_start_with_its_error(tmp_path):
    data = tmp_path / "data"
    done = up(
        "-m", "enginefarm", "up", "--port", "0", "--data-dir", str(data), ENGINEFARM_WORKER_TARGETS="no-such-target"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert TRACEBACK not in done.stderr, done.stderr
    said = " ".join(done.stderr.split())
    assert "error: enginefarm up: worker embedded-0 (enginefarm worker) failed 3 starts in a row" in said, said
    assert f"its log, {data / 'worker-embedded-0.log'}, says: error: target 'no-such-target'" in said, said


def test_a_database_that_refuses_says_so(tmp_path):
    url = f"postgresql+psycopg://postgres:hidden-secret@127.0.0.1:{free_port()}/enginefarm"  # nothing listens
    done = up(
        "-m", "enginefarm", "up", "--port", "0", "--data-dir", str(tmp_path / "data"), ENGINEFARM_DATABASE_URL=url
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert TRACEBACK not in done.stderr, done.stderr
    said = " ".join(done.stderr.split())
    assert "error: enginefarm up: cannot open the farm's catalog, postgresql+psycopg://postgres:***@127.0.0.1:" in said
    assert "(ENGINEFARM_DATABASE_URL); the database refused the connection" in said, said
    assert "Connection refused" in said and "hidden-secret" not in said, said


# ------------------------------------------------------------------------------ which lines of a log say why


PLAIN = """\
INFO starting
Traceback (most recent call last):
  File "a.py", line 1, in <module>
psycopg.OperationalError: connection failed

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "b.py", line 2, in <module>
    connect()
    ^^^^^^^^^
sqlalchemy.exc.OperationalError: (psycopg.OperationalError) connection failed: Connection refused
\tIs the server running on that host and accepting TCP/IP connections?
(Background on this error at: https://sqlalche.me/e/20/e3q8)
2026-01-01 10:00:00,000 INFO shutting down
ERROR:    Application startup failed. Exiting.
"""

BOXED = """\
╭───────────── Traceback (most recent call last) ─────────────╮
│ /x/cli.py:39 in run                                         │
│ ❱  39 │   │   return fn(*args, **kwargs)                    │
╰─────────────────────────────────────────────────────────────╯
ModuleNotFoundError: No module named 'api'
"""


def test_error_lines_take_the_last_exception_and_the_errors_after_it():
    from server.starterrors import error_lines

    assert error_lines(PLAIN) == [
        "sqlalchemy.exc.OperationalError: (psycopg.OperationalError) connection failed: Connection refused",
        "\tIs the server running on that host and accepting TCP/IP connections?",
        "(Background on this error at: https://sqlalche.me/e/20/e3q8)",
        "ERROR:    Application startup failed. Exiting.",
    ]
    assert error_lines(BOXED) == ["ModuleNotFoundError: No module named 'api'"]


def test_error_lines_without_a_traceback_are_the_error_lines_else_the_last_lines():
    from server.starterrors import error_lines

    celery = "\n".join(
        ["[2026-01-01 10:00:00,000: INFO/MainProcess] Connected"]
        + [
            f"[2026-01-01 10:00:0{i},000: ERROR/MainProcess] consumer: Cannot connect: Connection refused."
            for i in range(30)
        ]
    )
    assert len(error_lines(celery)) == 20 and all("Cannot connect" in line for line in error_lines(celery))
    assert error_lines("one\n\ntwo\nthree\n", limit=2) == ["two", "three"]
    assert error_lines("x" * 1000)[0].endswith("...") and len(error_lines("x" * 1000)[0]) == 400


def test_a_local_server_that_exits_says_why(tmp_path, monkeypatch):
    """``localservers.seaweedfs`` (the tests' and benchmarks' S3 server): a ``weed`` that exits at once is named,
    with its own last error line and its log's path."""
    from server.localservers import seaweedfs
    from server.starterrors import StartFailed

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    weed = bin_dir / "weed"
    weed.write_text(
        "#!/bin/sh\necho 'I1207 01:02:03.000 master.go:1] starting'\n"
        "echo 'F1207 01:02:03.100 server.go:2] listen tcp 127.0.0.1:9333: bind: address already in use'\nexit 1\n"
    )
    weed.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(StartFailed) as failed, seaweedfs(tmp_path / "s3", timeout=20):
        pass
    said = str(failed.value)
    assert said.startswith("SeaweedFS (weed server, S3 on port "), said
    assert f"exited with code 1 while the farm was starting; its log, {tmp_path / 's3' / 'weed.log'}, says:" in said
    assert said.endswith("    F1207 01:02:03.100 server.go:2] listen tcp 127.0.0.1:9333: bind: address already in use")
