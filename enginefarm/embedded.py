"""Start a whole farm on one machine: the API and Celery workers as child processes.

Used by ``enginefarm up`` and ``enginefarm demo`` (SQLite, local blobs, a database broker),
and by the tests and benchmarks with other settings (PostgreSQL, Redis, S3). One code path.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from enginefarm.config import KEEP_ALIVE_SECONDS
from storage.db import migrate


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


class Farm:
    """An API process plus worker processes, all sharing ``env`` (ENGINEFARM_* settings)."""

    def __init__(self, env: dict[str, str], host: str = "127.0.0.1", port: int | None = None, log_dir: Path | None = None,
                 token: str | None = None):
        """``token``: an API token this object uses to watch the farm (workers' heartbeats)."""
        self.env = {**os.environ, **env}
        self.token = token
        self.host, self.port = host, port or free_port()
        self.log_dir = log_dir
        self.api: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        out = open(self.log_dir / f"{name}.log", "ab") if self.log_dir else subprocess.DEVNULL
        # Own process group, so stopping the farm also stops Celery's pool children.
        return subprocess.Popen(args, env={**self.env, **(extra_env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def start_api(self, timeout: float = 60.0, workers: int = 1, extra_env: dict[str, str] | None = None) -> None:
        """``workers``: uvicorn worker processes (more than one spreads requests over CPU cores)."""
        self.api = self._spawn("api", [sys.executable, "-m", "uvicorn", "api.main:app", "--host", self.host,
                                       "--port", str(self.port), "--log-level", "warning",
                                       "--timeout-keep-alive", str(KEEP_ALIVE_SECONDS), "--workers", str(workers)],
                               extra_env)
        wait_http(f"{self.url}/healthz", timeout, self.api)

    def start_worker(self, name: str, targets: list[str] | None = None, concurrency: int = 1, pool: str = "prefork",
                     extra_env: dict[str, str] | None = None, bench_targets: list[str] | None = None) -> subprocess.Popen:
        """``targets``/``bench_targets``: what it builds and benchmarks (None: what the probe finds, []: nothing)."""
        args = [sys.executable, "-m", "enginefarm.cli", "worker", "--name", name, "--concurrency", str(concurrency),
                "--pool", pool]
        if targets is not None:
            args += ["--targets", ",".join(targets) or "none"]
        if bench_targets is not None:
            args += ["--bench-targets", ",".join(bench_targets) or "none"]
        proc = self._spawn(f"worker-{name}", args, extra_env)
        self.workers[name] = proc
        return proc

    def wait_workers(self, names: list[str], timeout: float = 90.0) -> list[dict]:
        """Block until every named worker has sent a heartbeat; returns the live workers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.workers.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {name} exited with code {proc.returncode}")
            live = httpx.get(f"{self.url}/v1/workers", timeout=5, headers=self.headers).json()
            if set(names) <= {w["id"].split("@")[0] for w in live}:
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

    def stop(self) -> None:
        for proc in self.workers.values():
            self.stop_process(proc)
        if self.api is not None:
            self.stop_process(self.api)

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def embedded_env(data_dir: Path) -> dict[str, str]:
    """Settings for the embedded mode: everything under ``data_dir``, no servers."""
    return {"ENGINEFARM_DATA_DIR": str(data_dir), "ENGINEFARM_BLOB_STORE": "local"}


def prepare(settings) -> None:
    settings.ensure_dirs()
    migrate(settings)


def issue_token(settings, name: str, scopes: list[str], project: str | None = None) -> str:
    """Make an API token in the farm's catalog (migrating it first); returns the token."""
    from storage.db import session_scope
    from storage.tokens import create_token

    prepare(settings)
    with session_scope(settings) as session:
        return create_token(session, name, scopes, project=project)[1]
