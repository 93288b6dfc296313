"""The collector also clears a host's work dir: spool files of uploads an API crash cut off and scratch folders of
killed builds go, once no process holds them and they are past their age; those in use never do."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from enginefarm.core import worklock
from enginefarm.core.config import Settings
from server.embedded import Farm, embedded_env, issue_token
from storage.db import migrate
from storage.gc import collect_garbage

ROOT = Path(__file__).resolve().parents[3]
GRACE = 3600.0


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = Settings(data_dir=tmp_path / "farm")
    migrate(settings)
    settings.ensure_dirs()
    return settings


def age(path: Path, seconds: float) -> None:
    when = time.time() - seconds
    os.utime(path, (when, when))


def spool(settings: Settings, name: str, size: int = 100, old: float = 0.0) -> Path:
    folder = settings.work_dir / worklock.SPOOL_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{worklock.SPOOL_PREFIX}{name}"
    path.write_bytes(b"x" * size)
    age(path, old)
    return path


def scratch(settings: Settings, name: str, old: float = 0.0) -> Path:
    path = settings.work_dir / f"{worklock.SCRATCH_PREFIX}{name}"
    (path / "bundle").mkdir(parents=True)
    (path / "bundle" / "model.onnx").write_bytes(b"y" * 50)
    age(path, old)
    return path


def holder(settings: Settings, code: str) -> subprocess.Popen:
    """A process that runs ``code`` with ``settings`` (as ``s``), prints a path, and waits to be killed."""
    script = (
        textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from enginefarm.core.config import Settings
        from enginefarm.core.worklock import Scratch
        from enginefarm.core import worklock
        s = Settings(data_dir={str(settings.data_dir)!r})
    """)
        + textwrap.dedent(code)
        + "\nprint(path, flush=True)\ntime.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    return proc


def test_old_spool_files_and_scratch_folders_no_one_holds_are_removed(settings):
    dead_upload = spool(settings, "dead", 100, old=2 * GRACE)
    young_upload = spool(settings, "young", 10, old=10)
    dead_build = scratch(settings, "dead", old=2 * GRACE)
    young_build = scratch(settings, "young", old=600)
    report = collect_garbage(settings, grace_seconds=GRACE)
    assert report.stale_uploads == [str(dead_upload.relative_to(settings.work_dir))]
    assert report.stale_scratch == [dead_build.name]
    assert report.stale_bytes == 150
    assert not dead_upload.exists() and not dead_build.exists()
    assert young_upload.exists() and young_build.exists()
    assert "1 upload spool file(s) and 1 scratch folder(s)" in report.summary()


def test_spool_files_are_dead_once_idle_past_the_upload_timeout(settings):
    """An unheld spool file untouched for longer than an upload may pause is dead, well before the grace period."""
    idle = settings.upload_idle_timeout_s
    dead = spool(settings, "idle", old=idle + 60)
    live = spool(settings, "fresh", old=idle / 4)
    report = collect_garbage(settings, grace_seconds=GRACE)
    assert report.stale_uploads == [str(dead.relative_to(settings.work_dir))]
    assert not dead.exists() and live.exists()


def test_dry_run_removes_nothing(settings):
    dead_upload, dead_build = spool(settings, "dry", old=2 * GRACE), scratch(settings, "dry", old=2 * GRACE)
    report = collect_garbage(settings, grace_seconds=GRACE, dry_run=True)
    assert report.stale_uploads and report.stale_scratch
    assert dead_upload.exists() and dead_build.exists()


def test_held_ones_are_kept_however_old(settings):
    """A spool file this process holds (as the API holds an upload's) and a scratch folder a live worker process
    holds are in use: never removed, even long past every age."""
    upload = spool(settings, "held", old=10 * GRACE)
    lock = worklock.hold(upload)
    proc = holder(settings, "path = Scratch(s).__enter__()")
    try:
        build = Path(proc.stdout.readline().strip())
        age(build, 10 * GRACE)
        report = collect_garbage(settings, grace_seconds=0)
        assert report.stale_uploads == [] and report.stale_scratch == []
        assert upload.exists() and build.exists()
    finally:
        worklock.release(lock)
        proc.kill()
        proc.wait()
    # Released (the worker died): now they go.
    report = collect_garbage(settings, grace_seconds=0)
    assert report.stale_uploads == [str(upload.relative_to(settings.work_dir))]
    assert report.stale_scratch == [build.name]
    assert not upload.exists() and not build.exists()


def test_scratch_folder_of_a_killed_build_is_collected(settings):
    proc = holder(
        settings,
        """
        path = Scratch(s).__enter__()
        (path / "engine.plan").write_bytes(b"z" * 1000)
    """,
    )
    build = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert build.exists()  # what a killed worker leaves
    age(build, 2 * settings.build_time_limit_s)
    report = collect_garbage(settings, grace_seconds=10 * settings.build_time_limit_s)
    assert report.stale_scratch == [build.name] and report.stale_bytes == 1000
    assert not build.exists()


def test_gc_command_removes_the_spool_of_an_upload_an_api_crash_cut_off(tmp_path):
    """A real embedded API is killed (SIGKILL) in the middle of an upload; ``enginefarm gc`` then removes its spool
    file and says so."""
    data = tmp_path / "farm"
    settings = Settings(data_dir=data)
    env = embedded_env(data) | {"ENGINEFARM_RECONCILE_SECONDS": "0"}
    farm = Farm(env, log_dir=tmp_path, token=issue_token(settings, "crash", ["build"]))
    farm.start_api()
    try:
        parts = urlsplit(farm.url)
        sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
        sock.sendall(
            f"POST /v1/models HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {farm.token}\r\n"
            "Content-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: 100000\r\n\r\n"
            '--XyZ\r\nContent-Disposition: form-data; name="name"\r\n\r\ncrash\r\n'
            '--XyZ\r\nContent-Disposition: form-data; name="file"; filename="m.onnx"\r\n\r\n'.encode()
            + b"\x08" * 5000
        )
        folder = settings.work_dir / worklock.SPOOL_FOLDER
        deadline = time.monotonic() + 20
        while not list(folder.glob("upload-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        Farm.stop_process(farm.api, signal.SIGKILL)
        sock.close()
    finally:
        farm.stop()
    left = list(folder.glob("upload-*"))
    assert len(left) == 1, left
    age(left[0], 2 * settings.upload_idle_timeout_s)
    out = subprocess.run(
        [sys.executable, "-m", "enginefarm", "gc", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["stale_uploads"] == [str(left[0].relative_to(settings.work_dir))], report
    assert report["stale_bytes"] == 5000
    assert not left[0].exists()
    out = subprocess.run(
        [sys.executable, "-m", "enginefarm", "gc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert "deleted 0 upload spool file(s)" in " ".join(out.stdout.split()), out.stdout
