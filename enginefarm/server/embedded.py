"""Start a whole farm on one machine: the API and Celery workers as child processes.

Used by ``enginefarm up`` and ``enginefarm demo`` (SQLite, local blobs, a database broker),
and by the tests and benchmarks with other settings (PostgreSQL, Redis, S3). One code path.

The farm never outlives the process that started it: every child gets SIGKILL when that process dies
(``lifeline``), and Celery's pool processes get it when their worker dies.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from enginefarm.core.workerid import worker_name
from enginefarm.server import lifeline
from enginefarm.storage.db import migrate

log = logging.getLogger(__name__)
# A child that dies sooner than this after its start is failing, not unlucky: its next start waits twice as
# long as the last, up to RESTART_MAX_DELAY_S.
HEALTHY_AFTER_S = 60.0
RESTART_MAX_DELAY_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with code {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def exit_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclass
class _Child:
    """How to start one child again, and how its starts went."""

    args: list[str]
    extra_env: dict[str, str] | None
    started: float = 0.0
    quick_exits: int = 0  # exits in a row, each sooner than HEALTHY_AFTER_S after its start
    restart_at: float | None = None


class Farm:
    """An API process plus worker processes, all sharing ``env`` (ENGINEFARM_* settings)."""

    def __init__(
        self,
        env: dict[str, str],
        host: str = "127.0.0.1",
        port: int | None = None,
        log_dir: Path | None = None,
        token: str | None = None,
        stop_timeout: float = 20.0,
    ):
        """``token``: an API token this object uses to watch the farm (workers' heartbeats). ``stop_timeout``: how
        long the workers, then the API, have to stop when the farm stops, before they are killed."""
        self.env = {**os.environ, **env}
        self.stop_timeout = stop_timeout
        self.token = token
        self.host, self.port = host, port or free_port()
        self.log_dir = log_dir
        self.api: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self._children: dict[str, _Child] = {}  # by log name: "api", "worker-NAME"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _spawn(
        self, name: str, args: list[str], extra_env: dict[str, str] | None = None, child: _Child | None = None
    ) -> subprocess.Popen:
        """``child``: the record of an earlier start of the same command (its restart history)."""
        child = self._children[name] = child or _Child(args, extra_env)
        child.started, child.restart_at = time.monotonic(), None
        out = open(self.log_dir / f"{name}.log", "ab") if self.log_dir else subprocess.DEVNULL  # noqa: SIM115 - closed below, once the child has its own
        try:
            # Own process group, so stopping the farm also stops Celery's pool children.
            return lifeline.spawn(
                args,
                env={**self.env, **(extra_env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):  # not DEVNULL
                out.close()  # the child has its own descriptor

    def start_api(self, timeout: float = 60.0, workers: int = 1, extra_env: dict[str, str] | None = None) -> None:
        """``workers``: uvicorn worker processes (more than one spreads requests over CPU cores)."""
        self.api = self._spawn(
            "api",
            [
                sys.executable,
                "-m",
                "enginefarm",
                "api",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--workers",
                str(workers),
            ],
            extra_env,
        )
        wait_http(f"{self.url}/healthz", timeout, self.api)

    def start_worker(
        self,
        name: str,
        targets: list[str] | None = None,
        concurrency: int = 1,
        pool: str = "prefork",
        extra_env: dict[str, str] | None = None,
        bench_targets: list[str] | None = None,
    ) -> subprocess.Popen:
        """``targets``/``bench_targets``: what it builds and benchmarks (None: what the probe finds, []: nothing)."""
        args = [
            sys.executable,
            "-m",
            "enginefarm",
            "worker",
            "--name",
            name,
            "--concurrency",
            str(concurrency),
            "--pool",
            pool,
        ]
        if targets is not None:
            args += ["--targets", ",".join(targets) or "none"]
        if bench_targets is not None:
            args += ["--bench-targets", ",".join(bench_targets) or "none"]
        proc = self._spawn(f"worker-{name}", args, extra_env)
        self.workers[name] = proc
        return proc

    def wait_workers(self, names: list[str], timeout: float = 90.0, restart: bool = False) -> list[dict]:
        """Block until every named worker has sent a heartbeat; returns the live workers. A worker that exits
        meanwhile is an error, unless ``restart``: then it is started again (``supervise``), as it would be later."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if restart:
                self.supervise()
            for name, proc in self.workers.items():
                if proc.poll() is not None and not restart:
                    raise RuntimeError(f"worker {name} exited with code {proc.returncode}")
            live = httpx.get(f"{self.url}/v1/workers", timeout=5, headers=self.headers).json()
            if set(names) <= {worker_name(w["id"]) for w in live}:
                return live
            time.sleep(0.3)
        raise TimeoutError(f"workers {names} did not report within {timeout} s")

    @staticmethod
    def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass

    @staticmethod
    def stop_processes(procs: list[subprocess.Popen], timeout: float = 20.0) -> None:
        """SIGTERM every process group at once, then SIGKILL what is left of them after ``timeout`` in all."""
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                Farm.stop_process(proc, signal.SIGKILL, 10)

    def stop(self) -> None:
        """The workers, then the API."""
        self._children.clear()  # a stopped farm starts nothing again
        self.stop_processes(list(self.workers.values()), self.stop_timeout)
        if self.api is not None:
            self.stop_processes([self.api], self.stop_timeout)

    def supervise(self, now: float | None = None) -> None:
        """Start again every child that exited, the API or a worker: at once the first time, then after a delay
        that doubles while it keeps dying young. Call it every second or so."""
        now = time.monotonic() if now is None else now
        running = {"api": self.api, **{f"worker-{n}": p for n, p in self.workers.items()}}
        for key, child in self._children.items():
            proc = running.get(key)
            if proc is None or proc.poll() is None:
                continue
            if child.restart_at is None:
                lived = now - child.started
                child.quick_exits = child.quick_exits + 1 if lived < HEALTHY_AFTER_S else 0
                delay = min(RESTART_MAX_DELAY_S, 2.0 ** (child.quick_exits - 1)) if child.quick_exits else 0.0
                child.restart_at = now + delay
                log.warning(
                    "%s %s after %.0f s; starting it again in %.0f s", key, exit_reason(proc.returncode), lived, delay
                )
            if now >= child.restart_at:
                fresh = self._spawn(key, child.args, child.extra_env, child)
                if key == "api":
                    self.api = fresh
                else:
                    self.workers[key.removeprefix("worker-")] = fresh

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def stop_on_sigterm():
    """SIGTERM (systemd, kill) ends the block as Ctrl-C does, so the farm's ``with`` stops its children in order.

    A KeyboardInterrupt that leaves code run by ``exec()`` of a string (a library's import, a dataclass being made)
    sets CPython's "unhandled KeyboardInterrupt" mark even when the caller catches it, and the process then ends by
    SIGINT at exit: a clean stop that systemd reads as a crash. Any later ``exec()`` of a string clears the mark,
    so the block's end runs one. (``enginefarm reconcile --loop``, which starts no children, takes its signals with
    ``sigtimedwait`` instead.)"""

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        exec("pass")  # a constant: clears the mark described above


def embedded_env(data_dir: Path) -> dict[str, str]:
    """Settings for the embedded mode: everything under ``data_dir``, no servers."""
    return {"ENGINEFARM_DATA_DIR": str(data_dir), "ENGINEFARM_BLOB_STORE": "local"}


def prepare(settings) -> None:
    settings.ensure_dirs()
    migrate(settings)


def issue_token(settings, name: str, scopes: list[str], project: str | None = None) -> str:
    """Make an API token in the farm's catalog (migrating it first); returns the token."""
    from enginefarm.storage.db import session_scope
    from enginefarm.storage.tokens import create_token

    prepare(settings)
    with session_scope(settings) as session:
        return create_token(session, name, scopes, project=project)[1]
