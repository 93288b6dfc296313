"""The reconciler: the catalog is the source of truth, the broker only a way to wake workers.

Every few seconds it (1) puts back in the queue the running tasks (builds, benchmarks, int8 quantization
stages) whose worker stopped sending heartbeats, and (2) publishes again the tasks that have been queued a
while when their queue holds no message at all: their message was lost (Redis restarted empty, a publish
failed after the commit).
A duplicate message is harmless: a task is claimed with a conditional update, so only one delivery runs.
It runs in the API process (``start_reconciler``) and as ``enginefarm reconcile``.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone

from enginefarm.core.config import Settings
from storage import liveness, tokens
from storage.db import session_scope
from storage.leader import Leadership
from storage.queue import Message, publish, queue_size

log = logging.getLogger(__name__)
# A dead worker stays listed (as not live) this long, so an operator can still see which one went silent.
FORGET_WORKERS_AFTER_S = 3600.0


def reconcile_once(settings: Settings) -> dict[str, int]:
    """One pass; returns how many tasks it requeued and republished, and how many ended sessions it removed."""
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=settings.republish_after_seconds)
    with session_scope(settings) as s:
        liveness.prune_workers(s, max(FORGET_WORKERS_AFTER_S, 10 * settings.worker_ttl_seconds))
        live = {w.id for w in liveness.live_workers(s, settings.worker_ttl_seconds)}
        lost_builds, lost_benches = liveness.requeue_abandoned(s, live)
        lost_stages, _ = liveness.requeue_abandoned_quantize(s, live, settings.max_deliveries)
        requeued = [Message.build(t.id, t.parsed_target) for t in lost_builds]
        requeued += [Message.bench(t.id, t.parsed_target) for t in lost_benches]
        requeued += [Message.quantize(i, stage) for i, stage in lost_stages]
        # Dashboard sessions that ended (signed out, revoked, expired) can never be used again; a minute's grace,
        # as at sign-in, so that signing out and in again does not hand back a sign-in the rate limit counted.
        sessions = tokens.remove_ended_sessions(s, opened_before=datetime.now(timezone.utc) - timedelta(minutes=1))
        builds, benches, waiting = liveness.queued_since(s, cutoff)
        stale = [Message.build(t.id, t.parsed_target) for t in builds]
        stale += [Message.bench(t.id, t.parsed_target) for t in benches]
        stale += [Message.quantize(b.id, b.quantize) for b in waiting]
    sizes: dict[str, int] = {}

    def empty(name: str) -> bool:
        if name not in sizes:
            sizes[name] = queue_size(name)
        return sizes[name] == 0

    again = [m for m in stale if m not in requeued and empty(m.queue)]
    publish(requeued + again)
    if requeued or again:
        log.warning(
            "reconciler: requeued %d task(s) of dead workers, republished %d lost message(s)%s",
            len(requeued),
            len(again),
            "".join(f"; {m.kind} {m.ident} to {m.queue}" for m in again[:20]),
        )
    return {"requeued": len(requeued), "republished": len(again), "sessions_removed": sessions}


class Reconciler:
    """``reconcile_once`` every ``settings.reconcile_seconds`` (and the blob sweep every ``gc_interval_seconds``)
    on a daemon thread until stopped, in the one process of the farm that holds the reconciler's lock."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # Every API process starts one; only the holder of the farm's lock works (storage.leader).
        self.leader = Leadership(settings, "reconciler")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="enginefarm-reconciler", daemon=True)

    def _loop(self) -> None:
        next_gc = time.monotonic() + self.settings.gc_interval_seconds
        while not self._stop.wait(self.settings.reconcile_seconds):
            if not self.leader.held():
                continue
            try:
                reconcile_once(self.settings)
            except Exception:  # the catalog or broker is down: the next pass tries again
                log.warning("reconciler pass failed", exc_info=True)
            if self.settings.gc_interval_seconds and time.monotonic() >= next_gc:
                next_gc = time.monotonic() + self.settings.gc_interval_seconds
                self._collect()

    def _collect(self) -> None:
        from storage.gc import collect_garbage

        try:
            report = collect_garbage(self.settings, grace_seconds=self.settings.gc_grace_seconds)
            if report.deleted or report.errors:
                log.warning("blob sweep: %s", report.summary())
        except Exception:  # refused (an empty catalog) or the store is down: the next sweep tries again
            log.warning("blob sweep failed", exc_info=True)

    def start(self) -> Reconciler:
        self._thread.start()
        return self

    def running(self) -> bool:
        """Whether its thread still works (a pass's error is logged and the next pass comes; anything else ends it)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=max(5.0, self.settings.reconcile_seconds * 2))
        self.leader.release()
