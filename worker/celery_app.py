"""The worker's Celery app: the queue's app (``enginefarm.storage.queue``), with a fresh database pool per forked
pool process."""

from __future__ import annotations

from celery.signals import worker_process_init

from enginefarm.storage.queue import celery_app

app = celery_app()


@worker_process_init.connect
def _fresh_connections(**_kwargs) -> None:
    # A forked pool process must not share the parent's database sockets.
    from enginefarm.storage.db import get_engine

    get_engine().dispose(close=False)
