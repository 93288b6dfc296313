"""A worker's two lanes: builds and benchmarks run in separate Celery pools, so a build never waits behind a
benchmark (one running, or any number queued), and benchmarks give way to builds.

A worker that builds and benchmarks starts a second Celery worker for its benchmark queues (the *benchmark lane*,
concurrency 1, the same worker id), tied to the first: it dies with it and is started again if it exits on its own.

A benchmark measures the machine, so it should not share it with builds: the benchmark lane starts measuring only
once this worker has no build running and none queued for its targets (``wait_for_builds``), for at most
``GIVE_WAY_MAX_S``; a build that arrives during a measurement still starts at once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable

from storage import liveness
from storage.db import session_scope

log = logging.getLogger(__name__)

# Set in a benchmark lane's environment: the worker id it serves under (the build lane's), and that worker's
# build targets, comma-separated (what its benchmarks give way to).
LANE_OF_ENV = "ENGINEFARM_LANE_OF"
BUILD_TARGETS_ENV = "ENGINEFARM_LANE_BUILD_TARGETS"
GIVE_WAY_MAX_S = 60.0
GIVE_WAY_POLL_S = 0.25
# How often a benchmark lane polls a database broker: a benchmark can start a little later; the CPU is the builds'.
LANE_POLL_S = 0.5
RESTART_DELAY_S = 1.0


def wait_for_builds(worker_id: str, max_s: float = GIVE_WAY_MAX_S) -> float:
    """In a benchmark lane: wait until its worker has no build running or queued (at most ``max_s``). Returns
    the seconds waited; at once outside a lane."""
    if os.environ.get(LANE_OF_ENV) != worker_id:
        return 0.0
    targets = [t for t in os.environ.get(BUILD_TARGETS_ENV, "").split(",") if t]
    started = time.monotonic()
    while time.monotonic() - started < max_s:
        try:
            with session_scope() as s:
                if not liveness.builds_pending(s, worker_id, targets):
                    break
        except Exception:  # the catalog is unavailable: measure now rather than wait on it
            log.warning("could not check for pending builds; benchmarking now", exc_info=True)
            break
        time.sleep(GIVE_WAY_POLL_S)
    waited = time.monotonic() - started
    if waited >= max_s:
        log.info("benchmarking after %.0f s although builds are pending", waited)
    return waited


class BenchmarkLane:
    """The benchmark lane's process, started by ``spawn``; started again if it exits before ``stop``."""

    def __init__(self, spawn: Callable[[], subprocess.Popen]):
        self._spawn = spawn
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._watch, name="enginefarm-bench-lane", daemon=True)

    def start(self) -> BenchmarkLane:
        with self._lock:
            self.proc = self._spawn()
        self._thread.start()
        return self

    def _watch(self) -> None:
        while True:
            assert self.proc is not None  # start() spawns it before it starts this thread
            code = self.proc.wait()
            if self._stopping.wait(RESTART_DELAY_S):
                return
            log.warning("the benchmark lane exited with code %s; starting it again", code)
            with self._lock:
                if self._stopping.is_set():
                    return
                self.proc = self._spawn()

    def stop(self, wait: bool = True, timeout: float | None = None) -> None:
        """SIGTERM (a warm shutdown: a running benchmark ends first), then, with ``wait``, wait for it."""
        self._stopping.set()
        with self._lock:
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        if not wait:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
