"""A worker's shutdown within its supervisor's grace period.

Celery's warm shutdown (SIGTERM) stops taking tasks and waits for the running ones with no limit; Kubernetes sends
SIGKILL ``terminationGracePeriodSeconds`` after SIGTERM. A task killed then would stay "running" until the reconciler
noticed its worker's silence, and the attempt would count towards ``ENGINEFARM_MAX_DELIVERIES``.

So, on the first SIGTERM (or SIGINT), ``Drain.begin`` gives the running tasks until a deadline,
``ENGINEFARM_SHUTDOWN_GRACE_SECONDS`` away. A task that ends before it ends as usual. At the deadline each task still
running is put back by the worker itself: its row goes back to ``queued`` (the attempt not counted: the task did not
fail, its worker left), its pool process is killed (so it cannot finish late) and its message acknowledged, and a
new message is published, which another worker takes at once. The heartbeat goes on meanwhile, so the reconciler
leaves the running tasks alone. Once the worker has stopped, ``Drain.finish`` puts back and publishes
again whatever still runs under its id: a benchmark that a full-TensorRT build ran in its own process, or a task
whose process died of a signal sent to the whole process group. A second SIGTERM or SIGINT changes nothing; SIGQUIT
is still Celery's cold shutdown, after which ``finish`` does the same.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from enginefarm.core.config import Settings
from storage import liveness
from storage.db import in_transaction
from storage.queue import KINDS, Message, publish

log = logging.getLogger(__name__)
T = TypeVar("T")
POLL_S = 0.2
# How long the database may be unavailable while a task is put back: past this the reconciler does it instead
# (the process must exit before its SIGKILL).
DB_PATIENCE_S = 3.0
# How long a worker waits for its benchmark lane past the grace (the lane drains within the same grace).
LANE_EXIT_S = 5.0


def running_requests() -> list:
    """The build, benchmark and quantize requests this worker's pool runs now (Celery's own record of them)."""
    from celery.worker import state

    for _ in range(5):  # the consumer thread changes the set while this thread copies it
        try:
            return [r for r in list(state.active_requests) if r.task_name in KINDS and r.args]
        except RuntimeError:
            continue
    return []


def requeue_reason(worker_id: str, grace: float | None = None) -> str:
    """Why a stopping worker put a task back: its grace ran out (``grace``), or it stopped with the task running."""
    why = f"was stopped and its shutdown grace of {grace:g} s ran out" if grace is not None else "stopped"
    return f"requeued: worker {worker_id} {why} before this task finished (the attempt does not count)"


class Drain:
    """Stops one Celery worker process within ``settings.shutdown_grace_seconds``. ``sweep``: this process is the
    last of its worker id to stop (not a benchmark lane), so ``finish`` puts back whatever still runs under it."""

    def __init__(self, settings: Settings, worker_id: str, sweep: bool = True):
        self.settings, self.worker_id, self.sweep = settings, worker_id, sweep
        self.grace = settings.shutdown_grace_seconds
        # Both set on the main thread only (signal handlers, Celery's shutdown, atexit), so no lock: a lock taken in
        # a signal handler could be held already by the code the signal interrupted.
        self.deadline: float | None = None
        self._finished = False
        self._pid = os.getpid()  # pool processes forked from this one inherit its atexit hooks
        self._pool = None
        self._thread = threading.Thread(target=self._watch, name="enginefarm-drain", daemon=True)

    def begin(self, **_) -> None:
        """Start the countdown (once; a receiver of Celery's ``worker_shutting_down``, in its signal handler)."""
        if self.deadline is not None:
            return
        self.deadline = time.monotonic() + self.grace
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):  # Celery's second SIGINT would cancel the running tasks
                signal.signal(sig, self._again)
        self._thread.start()

    def remaining(self) -> float:
        return self.grace if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def _again(self, signum, _frame) -> None:
        # In a signal handler: no logging (its lock may be held by the interrupted code).
        os.write(
            2,
            f"worker: {signal.Signals(signum).name} ignored, already stopping; running tasks go back to the "
            f"queue in {self.remaining():.0f} s\n".encode(),
        )

    def _watch(self) -> None:
        assert self.deadline is not None  # begin() sets it before it starts this thread
        if running := len(running_requests()):
            log.warning(
                "stopping: %d running task(s) get %g s to finish; what still runs then goes back to the queue",
                running,
                self.grace,
            )
        while running_requests():
            if time.monotonic() >= self.deadline:
                self.requeue_running()
                return
            time.sleep(POLL_S)

    def requeue_running(self) -> None:
        """Put back every task this process's pool still runs: its row back to queued, its process killed and its
        message acknowledged, and a new message published (so the queue holds it again within milliseconds, once)."""
        requests = {(KINDS[r.task_name], int(r.args[0])): r for r in running_requests()}
        ids = {kind: [i for k, i in requests if k == kind] for kind in KINDS.values()}
        reason = requeue_reason(self.worker_id, self.grace)
        try:
            released = self._write(
                liveness.release_tasks, self.worker_id, reason, build_ids=ids["build"], bench_ids=ids["bench"]
            )
            for i in ids["quantize"]:
                stage = self._write(liveness.release_quantize, i, self.worker_id, reason)
                if stage is not None:
                    released.append(Message.quantize(i, stage))
        except Exception:  # the catalog is down: the reconciler requeues them once this worker's row falls silent
            log.warning("could not put the running tasks back in the catalog", exc_info=True)
            released = None
        for request in requests.values():
            self._stop_task(request, acknowledge=released is not None)
        released = released or []
        publish(released)
        log.warning(
            "shutdown grace of %g s over: put %d running task(s) back in the queue: %s",
            self.grace,
            len(released),
            ", ".join(f"{m.kind} {m.ident}" for m in released) or "none",
        )

    def _stop_task(self, request, acknowledge: bool) -> None:
        """Kill the pool process running ``request``. ``acknowledge``: its row was put back (or is no longer this
        worker's), so its message goes too; as Celery revokes a task with terminate, which also spares the pool's
        wait for a lost job at shutdown. Otherwise the message goes back to the queue (task_reject_on_worker_lost)."""
        try:
            if acknowledge and self._pool is not None:
                request.terminate(self._pool, signal.SIGKILL)
            elif request.worker_pid:
                os.kill(request.worker_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except Exception:
            log.warning("could not stop task %s", request.id, exc_info=True)

    def finish(self, **_) -> None:
        """Once the pool has stopped: put back and publish again every task still running under this worker id."""
        if self._finished or not self.sweep or os.getpid() != self._pid:
            return
        self._finished = True
        try:
            left = self._write(liveness.release_tasks, self.worker_id, requeue_reason(self.worker_id))
        except Exception:
            log.warning("could not put the tasks left running back in the catalog", exc_info=True)
            return
        if left:
            publish(left)
            log.warning(
                "put %d task(s) left running back in the queue: %s",
                len(left),
                ", ".join(f"{m.kind} {m.ident}" for m in left),
            )

    def _write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(session, *args, **kwargs)`` in a transaction, with as much patience as a stop can spare."""
        return in_transaction(fn, *args, settings=self.settings, patience_s=DB_PATIENCE_S, **kwargs)

    def _ready(self, sender=None, **_) -> None:
        self._pool = getattr(sender, "pool", None)  # the consumer's: what stops a task's process

    def install(self) -> Drain:
        """Know the pool once the worker is ready; ``finish`` also at interpreter exit (a cold shutdown does not send
        Celery's ``worker_shutdown``)."""
        from celery.signals import worker_ready

        worker_ready.connect(self._ready, weak=False)
        atexit.register(self.finish)
        return self
