"""Worker heartbeats: a live worker's row in the catalog says which targets it serves."""

from __future__ import annotations

import logging
import socket
import threading

from enginefarm.core.config import Settings
from storage import liveness
from storage.db import session_scope

log = logging.getLogger(__name__)


def running_tasks() -> tuple[list[int], list[int]]:
    """The catalog ids of the build and benchmark tasks this worker's pool is executing now."""
    from storage.queue import BENCHMARK_TASK, BUILD_TASK
    from worker.process.drain import running_requests

    ids: dict[str, list[int]] = {BUILD_TASK: [], BENCHMARK_TASK: []}
    for request in running_requests():
        if request.task_name in ids:
            ids[request.task_name].append(int(request.args[0]))
    return ids[BUILD_TASK], ids[BENCHMARK_TASK]


class Heartbeat:
    """Writes this worker's row every ``settings.heartbeat_seconds`` until stopped, then removes it. Each beat
    also takes back this worker's running tasks that were requeued while it was silent (``reclaim_tasks``).

    ``row=False``: a benchmark lane (``worker.process.lanes``) under its build lane's worker id: it only takes
    back its own running tasks; the row is the build lane's to write and remove."""

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        targets: list[str],
        probe: dict,
        bench_targets: list[str] | None = None,
        row: bool = True,
    ):
        self.settings, self.worker_id, self.targets, self.probe = settings, worker_id, targets, probe
        self.bench_targets = bench_targets or []
        self.row = row
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="enginefarm-heartbeat", daemon=True)

    def beat(self) -> None:
        builds, benches = running_tasks()
        with session_scope(self.settings) as s:
            if self.row:
                liveness.heartbeat(
                    s, self.worker_id, socket.gethostname(), self.targets, self.probe, self.bench_targets
                )
            taken = liveness.reclaim_tasks(s, self.worker_id, builds, benches)
        if taken:
            log.warning("took back %d running task(s) requeued while this worker was silent", taken)

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_seconds):
            try:
                self.beat()
            except Exception:  # a database hiccup must not kill the worker; the next beat retries
                log.warning("heartbeat failed", exc_info=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if not self.row:
            return
        try:
            with session_scope(self.settings) as s:
                liveness.remove_worker(s, self.worker_id)
        except Exception:
            log.warning("could not remove worker row on shutdown", exc_info=True)
