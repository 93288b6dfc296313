"""Worker processes that die and come back, and supervisors that die: no task stays "running" for a worker that
is gone, and no process outlives the farm that started it. Real processes, real signals."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from enginefarm.client import Client
from enginefarm.core.config import Settings
from enginefarm.core.probe.machineprobe import normalize_platform
from enginefarm.core.workerid import worker_name
from enginefarm.graph.samples import sample_spec, save_conv_net
from server.embedded import free_port, issue_token
from tests.e2e.test_faults import NO_CHECKS, PORTABLE, wait_task
from tests.faults import audit, slow
from tests.helpers import unique_name

ORT_TARGET = f"onnxruntime/cpu-{normalize_platform(platform.machine())}"


# ------------------------------------------------------------------------------ processes, read from /proc


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every process below ``root``, as pid → start time (so a reused pid is not taken for the same process)."""
    parents: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            parents.setdefault(st[1], []).append((int(entry.name), st[2]))
    found, todo = {}, [root]
    while todo:
        for pid, start in parents.get(todo.pop(), []):
            found[pid] = start
            todo.append(pid)
    return found


def alive(procs: dict[int, int]) -> dict[int, str]:
    """Those of ``procs`` still running (a zombie has died: only its exit status is left), with their command."""
    left = {}
    for pid, start in procs.items():
        st = _stat(pid)
        if st is not None and st[2] == start and st[0] != "Z":
            try:
                left[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except FileNotFoundError:
                continue
    return left


def wait_gone(procs: dict[int, int], timeout: float) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while (left := alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_leftovers(procs: dict[int, int]) -> None:
    """A failed test must not leave its farm running on a shared machine."""
    for pid in alive(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------ `enginefarm up` and `demo`


def embedded_env(data_dir: Path) -> dict[str, str]:
    """The environment of an embedded farm in ``data_dir`` that knows nothing of the session's farm."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")}
    env.update(
        {
            "ENGINEFARM_DATA_DIR": str(data_dir),
            "ENGINEFARM_BLOB_STORE": "local",
            "PYTHONUNBUFFERED": "1",
            "ENGINEFARM_HEARTBEAT_SECONDS": "1",
            "ENGINEFARM_WORKER_TTL_SECONDS": "10",
            "ENGINEFARM_RECONCILE_SECONDS": "1",
            # One cheap target and no benchmarks: the worker starts fast on a busy machine.
            "ENGINEFARM_WORKER_TARGETS": ORT_TARGET,
            "ENGINEFARM_WORKER_BENCH_TARGETS": "none",
        }
    )
    return env


class Up:
    """``enginefarm up`` in its own process group, as a user or systemd starts it."""

    def __init__(self, data_dir: Path):
        self.data_dir, self.port = data_dir, free_port()
        self.token = issue_token(Settings(data_dir=data_dir, blob_store="local"), "lifecycle", ["admin"])
        self.log = data_dir / "up.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "enginefarm", "up", "--port", str(self.port)],
                env=embedded_env(data_dir),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def workers(self) -> list[dict]:
        r = httpx.get(f"{self.url}/v1/workers", headers={"Authorization": f"Bearer {self.token}"}, timeout=5)
        r.raise_for_status()
        return r.json()

    def stop(self, procs: dict[int, int]) -> dict[int, str]:
        """Stop it as an operator does (SIGTERM); what of ``procs`` and its own children still runs 20 s later,
        all of which is then killed."""
        procs |= descendants(self.proc.pid)
        if self.proc.poll() is None:
            stop_like_an_operator(self.proc, signal.SIGTERM)
        left = wait_gone(procs, 20)
        kill_leftovers(procs)
        return left

    def workers_seen(self) -> bool:
        """Whether any worker has heartbeated yet (False also while the API is not answering)."""
        try:
            return bool(self.workers())
        except httpx.HTTPError:
            return False

    def wait_worker(self, not_ids: set[str] = frozenset(), timeout: float = 120) -> str:
        """The id of a live worker ``embedded-0`` other than ``not_ids``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"enginefarm up exited with {self.proc.returncode}:\n{self.output()}"
            try:
                ids = [w["id"] for w in self.workers() if worker_name(w["id"]) == "embedded-0"]
            except httpx.HTTPError:
                ids = []
            if fresh := [i for i in ids if i not in not_ids]:
                return fresh[0]
            time.sleep(0.3)
        raise TimeoutError(f"no new worker embedded-0 within {timeout} s:\n{self.output()}")


def stop_like_an_operator(proc: subprocess.Popen, sig: int) -> None:
    """``sig`` to the process group; for SIGTERM, SIGKILL 20 s later if it is still there (as systemd does)."""
    os.killpg(proc.pid, sig)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


# ------------------------------------------------------------------------------ tests


def test_worker_restarted_under_its_name_gets_a_new_id_and_its_task_is_requeued(farm, tmp_path, dist_settings):
    """A worker SIGKILLed mid-build and started again with the same --name (as systemd restarts it) is a new
    worker: the task of the dead one is requeued once its heartbeats stop, and the new one builds it."""
    with Client(farm.url) as c:
        model, _ = c.upload(save_conv_net(tmp_path / "m.onnx", seed=93), unique_name("phoenix"))
        first = farm.start_worker("phoenix", [PORTABLE], bench_targets=[], extra_env=slow(60))
        farm.wait_workers(["phoenix"])
        build = c.build(model["id"], [PORTABLE], {**sample_spec(), **NO_CHECKS})
        running = wait_task(
            c,
            build["id"],
            lambda t: t["state"] == "running" and t["worker_id"].startswith("phoenix@"),
            what="running on the first phoenix",
        )
        old_id = running["worker_id"]
        time.sleep(2)  # inside the build: the test backend holds it for 60 s
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        farm.workers.pop("phoenix")
        farm.start_worker("phoenix", [PORTABLE], bench_targets=[])
        try:
            requeued = wait_task(
                c,
                build["id"],
                lambda t: t["state"] != "running" or t["worker_id"] != old_id,
                timeout=60,
                what="taken from the dead worker",
            )
            assert requeued["worker_id"] != old_id, requeued
            done = c.wait_build(build["id"], timeout=150, poll=0.3)
            live = [w["id"] for w in c.workers() if worker_name(w["id"]) == "phoenix"]
        finally:
            farm.stop_process(farm.workers.pop("phoenix"))
        task = done["tasks"][0]
        assert task["state"] == "succeeded", task
        assert worker_name(task["worker_id"]) == "phoenix" and task["worker_id"] != old_id, (task, old_id)
        assert task["attempts"] == 2 and not task["reused"], task
        assert old_id not in live and task["worker_id"] in live, (live, old_id)
    audit(dist_settings)


def test_up_survives_its_worker_being_killed(tmp_path):
    """SIGKILL of the embedded farm's worker: the API keeps answering and the supervisor starts a new worker,
    which heartbeats under a new id."""
    up = Up(tmp_path)
    procs: dict[int, int] = {}
    try:
        first = up.wait_worker()
        procs = descendants(up.proc.pid)
        workers = [
            pid for pid, cmd in alive(procs).items() if (_stat(pid) or ("", 0))[1] == up.proc.pid and " worker " in cmd
        ]
        assert len(workers) == 1, (alive(procs), up.output())
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:  # the API never goes away meanwhile
            assert up.proc.poll() is None, f"enginefarm up exited with {up.proc.returncode}:\n{up.output()}"
            try:
                assert httpx.get(f"{up.url}/healthz", timeout=15).status_code == 200, up.output()
            except httpx.TransportError as exc:
                raise AssertionError(f"the API stopped answering ({exc}):\n{up.output()}") from exc
            time.sleep(0.5)
        second = up.wait_worker(not_ids={first}, timeout=60)
        assert second != first
        assert "embedded-0" in up.output() and "SIGKILL" in up.output(), up.output()  # the supervisor says why
        procs |= descendants(up.proc.pid)
    finally:
        left = up.stop(procs)
    assert not left, left


def test_up_survives_its_worker_dying_before_its_first_heartbeat(tmp_path):
    """Was broken: `enginefarm up` waited for its worker's first heartbeat and gave up, taking the API with it,
    when the worker died before sending one (seen under load: the kill came while `up` still waited)."""
    up = Up(tmp_path)
    procs: dict[int, int] = {}
    try:
        deadline, victim = time.monotonic() + 60, None
        while victim is None and time.monotonic() < deadline:  # the worker process, as soon as it exists
            procs = descendants(up.proc.pid)
            victim = next(
                (
                    pid
                    for pid, cmd in alive(procs).items()
                    if (_stat(pid) or ("", 0))[1] == up.proc.pid and " worker " in cmd
                ),
                None,
            )
            time.sleep(0.05)
        assert victim is not None, up.output()
        assert not up.workers_seen(), "the worker heartbeated before the test could kill it"
        os.kill(victim, signal.SIGKILL)
        worker = up.wait_worker(timeout=90)  # a worker started again; up and its API still run
        assert worker and up.proc.poll() is None
        procs |= descendants(up.proc.pid)
    finally:
        left = up.stop(procs)
    assert not left, left


@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, signal.SIGKILL, signal.SIGKILL, signal.SIGKILL],
    ids=["sigterm", "sigkill-1", "sigkill-2", "sigkill-3"],
)
def test_up_leaves_no_process_behind(tmp_path, sig):
    """However `enginefarm up` is stopped, its API, its worker and the worker's pool processes stop with it."""
    up = Up(tmp_path)
    procs: dict[int, int] = {}
    try:
        up.wait_worker()
        procs = descendants(up.proc.pid)
        assert len(procs) >= 3, procs  # the API, the worker and its pool process
        stop_like_an_operator(up.proc, sig)
        left = wait_gone(procs, 30)
    finally:
        kill_leftovers(procs | descendants(up.proc.pid))
        if up.proc.poll() is None:
            up.proc.kill()
            up.proc.wait(10)
    assert not left, f"still running after enginefarm up got {sig.name}: {left}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_demo_leaves_no_process_behind(tmp_path, sig):
    """`enginefarm demo` stopped while its farm runs leaves nothing running either."""
    log = tmp_path / "demo.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "enginefarm", "demo", "--data-dir", str(tmp_path / "data")],
            env={
                k: v
                for k, v in embedded_env(tmp_path / "data").items()
                if k not in ("ENGINEFARM_WORKER_TARGETS", "ENGINEFARM_WORKER_BENCH_TARGETS")
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    procs: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 180
        while "farm up at" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.3)
        procs = descendants(proc.pid)
        assert len(procs) >= 3, procs
        stop_like_an_operator(proc, sig)
        left = wait_gone(procs, 30)
    finally:
        kill_leftovers(procs | descendants(proc.pid))
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not left, f"still running after enginefarm demo got {sig.name}: {left}"


def test_a_child_started_from_a_short_lived_thread_outlives_the_thread():
    """Linux ties a child's death signal to the thread that started it: a worker restarted from a thread pool
    (as the race test does) must live on after that thread ends, and still die with the process."""
    from concurrent.futures import ThreadPoolExecutor

    from server import lifeline

    def start() -> subprocess.Popen:
        proc = lifeline.spawn(["sleep", "60"])
        time.sleep(1.5)  # the child has asked for its death signal by now; then this thread ends
        return proc

    with ThreadPoolExecutor(1) as pool:
        proc = pool.submit(start).result()
    try:
        time.sleep(0.5)
        assert proc.poll() is None, f"killed by the end of the thread that started it: {proc.returncode}"
    finally:
        proc.kill()
        proc.wait(10)
