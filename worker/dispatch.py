"""Publishing tasks to their queues by task name, after the catalog rows they name are committed.

By name (``send_task``), so the API and the tasks themselves can publish without importing each other.
A failed publish is logged, not raised: the row is in the catalog and the broker can be retried.
"""

from __future__ import annotations

import logging

from enginefarm.domain import QUANTIZE_QUEUE, Target

log = logging.getLogger(__name__)

BUILD_TASK = "enginefarm.build_engine"
BENCHMARK_TASK = "enginefarm.benchmark_engine"
QUANTIZE_TASK = "enginefarm.quantize_model"


def _send(name: str, arg: int, queue: str) -> None:
    from worker.celery_app import app

    try:
        app.send_task(name, args=[arg], queue=queue)
    except Exception:
        log.warning("could not publish %s(%s) to %s", name, arg, queue, exc_info=True)


def publish_build(task_id: int, target: Target) -> None:
    _send(BUILD_TASK, task_id, target.queue)


def publish_benchmark(task_id: int, target: str) -> None:
    _send(BENCHMARK_TASK, task_id, Target.parse(target).bench_queue)


def publish_quantize(build_id: int) -> None:
    _send(QUANTIZE_TASK, build_id, QUANTIZE_QUEUE)
