"""`enginefarm reconcile --loop` as the farm's background service: any number may run, one works at a time (it
holds the farm's job lock), and another takes over when it dies. On both catalogs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from storage.leader import Leadership


def held_by_someone(settings, within: float = 20) -> bool:
    """Whether a process other than this one holds the reconciler's job lock (asked until ``within`` s)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        probe = Leadership(settings, "reconciler")
        try:
            if not probe.held():
                return True
        finally:
            probe.release()
        time.sleep(0.2)
    return False


def test_services_take_the_job_one_at_a_time_and_hand_it_over(settings, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | {
        "ENGINEFARM_DATA_DIR": str(settings.data_dir),
        "ENGINEFARM_RECONCILE_SECONDS": "0.2",
        **({"ENGINEFARM_DATABASE_URL": settings.database_url} if settings.database_url else {}),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "enginefarm", "reconcile", "--loop"],
            env=env,
            stdout=open(tmp_path / f"r{i}.log", "wb"),  # noqa: SIM115 - the process's log, open while it runs
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    try:
        assert held_by_someone(settings), (tmp_path / "r0.log").read_text()
        assert all(p.poll() is None for p in procs), [(tmp_path / f"r{i}.log").read_text() for i in range(2)]
        procs[0].send_signal(signal.SIGKILL)  # holder or not, the job stays held by one
        procs[0].wait(10)
        assert held_by_someone(settings)
        procs[1].send_signal(signal.SIGTERM)  # stops cleanly and lets the job go
        assert procs[1].wait(30) == 0, (tmp_path / "r1.log").read_text()
        assert not held_by_someone(settings, within=2)
        assert "holds the farm's job lock" in (tmp_path / "r1.log").read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


# Loaded by the service's interpreter (PYTHONPATH): its first pass stops it from inside code run by exec(), as a
# library's import or dataclass does.
STOP_INSIDE_EXEC = '''
import storage.reconcile as reconcile

def first_pass(settings, _once=reconcile.reconcile_once):
    exec("import os, signal, time\\nos.kill(os.getpid(), signal.SIGTERM)\\ntime.sleep(0.5)")
    return _once(settings)

reconcile.reconcile_once = first_pass
'''


def test_a_stop_that_lands_inside_library_code_still_ends_the_service_cleanly(settings, tmp_path):
    """SIGTERM turned into KeyboardInterrupt and raised inside exec() left CPython set to end the process by SIGINT
    at exit, though the service caught it: systemd and Kubernetes saw a clean stop as a crash (-2)."""
    (tmp_path / "sitecustomize.py").write_text(STOP_INSIDE_EXEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | {
        "ENGINEFARM_DATA_DIR": str(settings.data_dir),
        "ENGINEFARM_RECONCILE_SECONDS": "0.2",
        "PYTHONPATH": str(tmp_path),
        **({"ENGINEFARM_DATABASE_URL": settings.database_url} if settings.database_url else {}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "enginefarm", "reconcile", "--loop"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "holds the farm's job lock" in done.stdout
    assert not held_by_someone(settings, within=1)
