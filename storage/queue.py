"""The task queue: the Celery app's settings, and publishing tasks by name after the catalog rows they name
are committed.

By name (``send_task``), so the API publishes without importing the worker. Each target has its own queue, so a
worker consumes only what it can build. A failed publish is logged, not raised: the row is in the catalog and the
reconciler publishes it again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from celery import Celery

from enginefarm.core.config import Settings, get_settings
from enginefarm.core.domain import QUANTIZE_QUEUE, Target

log = logging.getLogger(__name__)

BUILD_TASK = "enginefarm.build_engine"
BENCHMARK_TASK = "enginefarm.benchmark_engine"
QUANTIZE_TASK = "enginefarm.quantize_model"
# Longer than the longest build: Redis redelivers a message unacked for this long.
VISIBILITY_TIMEOUT_S = 6 * 3600


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    if settings.resolved_broker_url.startswith("sqla+"):
        from storage.broker import register

        register()
    # The worker's tasks, by module name: a worker process imports them; the API only publishes.
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
        # Task events (sent, started, succeeded, failed) for Flower and `celery events`.
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    return app


@cache
def celery_app() -> Celery:
    """This process's Celery app, made from its settings on first use."""
    return make_celery()


def queue_size(queue: str) -> int:
    """Messages waiting in a broker queue (0 for a queue the broker does not have)."""
    with celery_app().connection_for_read() as conn:
        try:
            return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
        except conn.channel_errors:
            return 0


KINDS = {BUILD_TASK: "build", BENCHMARK_TASK: "bench", QUANTIZE_TASK: "quantize"}
TASKS = {kind: name for name, kind in KINDS.items()}


@dataclass(frozen=True)
class Message:
    """One task message, published once the row it names is committed. Its payload is the row's id alone (JSON, as
    kombu carries it): the worker reads the target, the spec and the rest from the catalog, as ``Target`` and
    ``BuildSpec``. The target only chooses the queue, so a worker gets only what it can build or run."""

    kind: str  # "build", "bench" or "quantize"
    ident: int
    queue: str

    @classmethod
    def build(cls, task_id: int, target: Target) -> Message:
        return cls("build", task_id, target.queue)

    @classmethod
    def bench(cls, task_id: int, target: Target) -> Message:
        return cls("bench", task_id, target.bench_queue)

    @classmethod
    def quantize(cls, build_id: int, stage: dict | None = None) -> Message:
        """The build's waiting stage, on the queue its ``stage`` (``BuildRow.quantize``) names, else the quantize
        queue every ONNX Runtime worker consumes."""
        return cls("quantize", build_id, (stage or {}).get("queue") or QUANTIZE_QUEUE)


def publish(messages: Iterable[Message]) -> None:
    """Send each message. A failed send is logged, not raised: the row is committed, the reconciler sends it again."""
    for m in messages:
        try:
            celery_app().send_task(TASKS[m.kind], args=[m.ident], queue=m.queue)
        except Exception:
            log.warning("could not publish %s %s to %s", m.kind, m.ident, m.queue, exc_info=True)


def publish_build(task_id: int, target: Target) -> None:
    publish([Message.build(task_id, target)])


def publish_benchmark(task_id: int, target: Target) -> None:
    publish([Message.bench(task_id, target)])
