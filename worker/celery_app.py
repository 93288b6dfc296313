"""The Celery app. Each target has its own queue, so a worker consumes only what it can build."""

from __future__ import annotations

from celery import Celery
from celery.signals import worker_process_init

from enginefarm.config import Settings, get_settings

from worker.dispatch import BENCHMARK_TASK, BUILD_TASK, QUANTIZE_TASK  # noqa: F401 - the task names
# Longer than the longest build: Redis redelivers a message unacked for this long.
VISIBILITY_TIMEOUT_S = 6 * 3600


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    if settings.resolved_broker_url.startswith("sqla+"):
        from worker.broker import register

        register()
    app = Celery("enginefarm", broker=settings.resolved_broker_url, include=["worker.tasks"])
    transport_options: dict = {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    if settings.resolved_broker_url.startswith("sqla+"):
        transport_options["polling_interval"] = settings.broker_poll_seconds  # the database broker polls
    app.conf.update(
        task_ignore_result=True,  # state lives in the catalog, not in a result backend
        task_acks_late=True,  # a worker that dies mid-build leaves its message to be redelivered
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # one build at a time per process: builds are long and heavy
        task_default_queue="enginefarm.default",
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_serializer="json",
        accept_content=["json"],
    )
    return app


app = make_celery()


@worker_process_init.connect
def _fresh_connections(**_kwargs) -> None:
    # A forked pool process must not share the parent's database sockets.
    from storage.db import get_engine

    get_engine().dispose(close=False)
