"""Start a whole farm on one machine: the API and Celery workers as child processes.

Used by ``enginefarm up`` and ``enginefarm demo`` (SQLite, local blobs, a database broker),
and by the tests and benchmarks with other settings (PostgreSQL, Redis, S3). One code path.

The farm never outlives the process that started it: every child gets SIGKILL when that process dies
(``lifeline``), and Celery's pool processes get it when their worker dies.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from enginefarm.core.workerid import worker_name
from server import lifeline
from server.starterrors import (
    EXCERPT_LINES,
    CatalogUnreachable,
    StartFailed,
    exit_reason,
    log_excerpt,
)
from storage.db import migrate

log = logging.getLogger(__name__)
# A child that dies sooner than this after its start is failing, not unlucky: its next start waits twice as
# long as the last, up to RESTART_MAX_DELAY_S.
HEALTHY_AFTER_S = 60.0
RESTART_MAX_DELAY_S = 60.0
# A child that dies this many times in a row before the farm is up fails the start, with its own error: one death
# may be bad luck (killed, starved of CPU), the same one three times is not.
START_TRIES = 3


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


@dataclass
class _Child:
    """How to start one child again, and how its starts went."""

    args: list[str]
    extra_env: dict[str, str] | None
    log: Path | None = None
    log_offset: int = 0  # where this start's output begins in ``log`` (logs are appended to)
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
        log_max_bytes: int = 64 << 20,
    ):
        """``token``: an API token this object uses to watch the farm (workers' heartbeats). ``stop_timeout``: how
        long the workers, then the API, have to stop when the farm stops, before they are killed.
        ``log_max_bytes``: a child's log past this size is moved to NAME.log.1 (``supervise``)."""
        self.log_max_bytes = log_max_bytes
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
        child.log = self.log_dir / f"{name}.log" if self.log_dir else None
        child.log_offset = child.log.stat().st_size if child.log is not None and child.log.exists() else 0
        out = open(child.log, "ab") if child.log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below, once the child has its own
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
        try:
            wait_http(f"{self.url}/healthz", timeout, self.api)
        except RuntimeError:  # it exited
            raise self.start_failed("api", exit_reason(self.api.returncode)) from None
        except TimeoutError:
            raise self.start_failed("api", f"did not answer {self.url}/healthz within {timeout:g} s") from None

    def describe(self, key: str) -> str:
        """A child, by its log name ("api", "worker-NAME"), in words."""
        if key == "api":
            return f"the farm's API (enginefarm api on port {self.port})"
        return f"worker {key.removeprefix('worker-')} (enginefarm worker)"

    def start_failed(self, key: str, how: str) -> StartFailed:
        """The error for the child ``key`` that failed the start ``how`` ("exited with code 1"), with the lines of
        its log, since its last start, that say why."""
        child = self._children.get(key)
        log, excerpt = (child.log, log_excerpt(child.log, child.log_offset)) if child else (None, [])
        notes = []
        if key == "api" and any("address already in use" in line.lower() for line in excerpt):
            notes.append(f"port {self.port} on {self.host} is in use by another process")
        return StartFailed(self.describe(key), how, log, excerpt, notes)

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
        """Block until every named worker has sent a heartbeat; returns the live workers. A worker (or the API) that
        exits meanwhile fails the start (``StartFailed``), unless ``restart``: then it is started again
        (``supervise``), as it would be later, and fails the start only once it has died START_TRIES times in a
        row."""
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        while time.monotonic() < deadline:
            if restart:
                self.supervise(give_up_after=START_TRIES)
            else:
                self._check_running()
            try:
                answer = httpx.get(f"{self.url}/v1/workers", timeout=5, headers=self.headers)
                answer.raise_for_status()
                live = answer.json()
            except httpx.HTTPError:  # the API is being started again (``restart``), or is busy: ask again
                live = None
            if live is not None:
                seen = {worker_name(w["id"]) for w in live}
                if set(names) <= seen:
                    return live
            time.sleep(0.3)
        silent = [n for n in names if n not in seen]
        raise self.start_failed(f"worker-{silent[0]}", f"sent no heartbeat within {timeout:g} s")

    def _check_running(self) -> None:
        """Raise ``StartFailed`` for the API or a worker that exited."""
        running = {"api": self.api, **{f"worker-{n}": p for n, p in self.workers.items()}}
        for key, proc in running.items():
            if proc is not None and proc.poll() is not None:
                raise self.start_failed(key, exit_reason(proc.returncode))

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

    def supervise(self, now: float | None = None, give_up_after: int | None = None) -> None:
        """Start again every child that exited, the API or a worker: at once the first time, then after a delay
        that doubles while it keeps dying young. Call it every second or so. ``give_up_after``: a child that has
        died young this many times in a row is not started again: ``StartFailed`` says why it died."""
        now = time.monotonic() if now is None else now
        running = {"api": self.api, **{f"worker-{n}": p for n, p in self.workers.items()}}
        for key, child in self._children.items():
            proc = running.get(key)
            if proc is None or proc.poll() is None:
                continue
            if child.restart_at is None:
                lived = now - child.started
                child.quick_exits = child.quick_exits + 1 if lived < HEALTHY_AFTER_S else 0
                if give_up_after is not None and child.quick_exits >= give_up_after:
                    how = exit_reason(proc.returncode)
                    raise self.start_failed(key, f"failed {child.quick_exits} starts in a row, the last {how},")
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
        for child in self._children.values():
            self._cap_log(child)

    def _cap_log(self, child: _Child) -> None:
        """A log past ``log_max_bytes`` is copied to NAME.log.1 (the one before goes) and emptied in place: the
        child appends (O_APPEND) and goes on writing at its new end. A line written between the copy and the
        truncation is lost, as with logrotate's copytruncate."""
        path = child.log
        try:
            if path is None or path.stat().st_size <= self.log_max_bytes:
                return
            shutil.copyfile(path, f"{path}.1")
            os.truncate(path, 0)
        except FileNotFoundError:  # removed by hand: the child writes on into the unlinked file, as it would anyway
            return
        except OSError as exc:  # a full disk: the next pass tries again
            log.warning("could not cut %s: %s", path, exc)
            return
        child.log_offset = 0

    def serve(self, workers: dict[str, int], announce: Callable[[], None]) -> None:
        """Start the API and ``workers`` (name: concurrency), ``announce`` once they are up, then keep them running
        (``supervise``) until Ctrl-C or SIGTERM, and stop the farm. A worker that dies while it starts is started
        again."""
        try:
            with stop_on_sigterm(), self:
                self.start_api()
                for name, concurrency in workers.items():
                    self.start_worker(name, concurrency=concurrency)
                self.wait_workers(list(workers), restart=True)
                announce()
                while True:
                    self.supervise()
                    time.sleep(1)
        except KeyboardInterrupt:
            pass

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def stop_on_sigterm():
    """SIGTERM (systemd, kill) ends the block as Ctrl-C does, so the farm's ``with`` stops its children in order.

    A KeyboardInterrupt that leaves code run by ``exec()`` of a string leaves CPython set to end the process by
    SIGINT at exit even when caught; the block's end runs one more ``exec()``, which clears that."""

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


def shown_url(url: str) -> str:
    """A database URL with its password hidden."""
    return re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", url)


def open_catalog(settings) -> None:
    """``prepare``, whose failure to reach or migrate the catalog's database is a ``CatalogUnreachable`` that says
    which database and what its driver said."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        prepare(settings)
    except SQLAlchemyError as exc:
        said = [line.rstrip() for line in str(exc).splitlines() if line.strip()][:EXCERPT_LINES]
        where = " (ENGINEFARM_DATABASE_URL)" if settings.database_url else ""
        refused = "; the database refused the connection" if "connection refused" in str(exc).lower() else ""
        raise CatalogUnreachable(
            "\n".join(
                [f"cannot open the farm's catalog, {shown_url(settings.resolved_database_url)}{where}{refused}:"]
                + [f"    {line}" for line in said]
            )
        ) from exc


UP_TOKEN_FILE = "up-token"  # in the data folder, readable by its owner only


def up_token(settings, name: str) -> tuple[str, bool]:
    """``enginefarm up``'s admin token and whether it is new: the one it made on an earlier start while the catalog
    still holds it active (kept beside the catalog, mode 0600, as the catalog itself is the farm's secret), so a
    restart neither piles up admin tokens nor ends the shells that exported the last one; else a new one."""
    import os

    from storage.db import session_scope
    from storage.tokens import authenticate

    path = settings.data_dir / UP_TOKEN_FILE
    if path.is_file():
        kept = path.read_text().strip()
        open_catalog(settings)
        with session_scope(settings) as session:
            known = authenticate(session, kept)
        if known is not None and known.scope == "admin" and known.project is None:
            return kept, False
    token = issue_token(settings, name, ["admin"])
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token, True


def issue_token(settings, name: str, scopes: list[str], project: str | None = None) -> str:
    """Make an API token in the farm's catalog (migrating it first); returns the token."""
    from storage.db import session_scope
    from storage.tokens import create_token

    open_catalog(settings)
    with session_scope(settings) as session:
        return create_token(session, name, scopes, project=project)[1]
