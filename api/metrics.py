"""Prometheus metrics of the API: GET /metrics.

What the API process counts (request latency per route, resolve outcomes, upload bytes, blob store errors) is in
prometheus-client's metrics, summed over the host's processes through ``PROMETHEUS_MULTIPROC_DIR`` where it is set
(``enginefarm api`` and ``enginefarm up`` set it). The queues, tasks and live workers are read from the catalog at
each scrape (``storage/observe.py``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from enginefarm.core.config import Settings
from storage.db import session_scope
from storage.observe import queue_state

REQUEST_SECONDS = Histogram(
    "enginefarm_http_request_duration_seconds",
    "API request latency, by route template",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
RESOLVES = Counter(
    "enginefarm_resolve_total",
    "Resolve answers by outcome: the chosen engine's match tier, not_modified (304), no_fit (404) or build (202)",
    ["outcome"],
)
UPLOAD_BYTES = Counter(
    "enginefarm_upload_bytes_total",
    "Bytes of files received, by form field (file: models, samples: sample inputs)",
    ["field"],
)


_SERIES: dict[tuple, Any] = {}


def labelled(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, kept once looked up: ``labels`` takes a lock and builds its key on every call
    (a twentieth of a 304's CPU in the app). The series are as many as the labels' combinations either way."""
    key = (id(metric), values)
    if (found := _SERIES.get(key)) is None:
        found = _SERIES[key] = metric.labels(*values)
    return found


class Observe:
    """ASGI middleware: every HTTP request's latency, by its route's template (not its path, which would give a
    series per engine id); a path no route matched counts as ``unmatched``."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or scope.get("metrics_route") or "unmatched"
            labelled(REQUEST_SECONDS, scope["method"], label, str(status[0])).observe(time.perf_counter() - started)


class CatalogCollector:
    """The farm's queues and workers, read from the catalog at each scrape."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def collect(self):
        with session_scope(self.settings) as s:
            state = queue_state(s, self.settings.worker_ttl_seconds)
        depth = GaugeMetricFamily(
            "enginefarm_queue_depth", "Tasks queued, by kind and target", labels=["kind", "target"]
        )
        age = GaugeMetricFamily(
            "enginefarm_queue_oldest_age_seconds", "Age of the oldest queued task", labels=["kind", "target"]
        )
        for (kind, target), (count, oldest) in sorted(state.waiting.items()):
            depth.add_metric([kind, target], count)
            age.add_metric([kind, target], oldest)
        tasks = GaugeMetricFamily(
            "enginefarm_tasks", "Tasks in the catalog, by kind and state", labels=["kind", "state"]
        )
        for (kind, task_state), count in sorted(state.by_state.items()):
            tasks.add_metric([kind, task_state], count)
        live = GaugeMetricFamily(
            "enginefarm_workers_live", "Live workers, by the targets they build or benchmark", labels=["role", "target"]
        )
        for role, counts in (("build", state.live_workers), ("benchmark", state.live_bench_workers)):
            for target, count in sorted(counts.items()):
                live.add_metric([role, target], count)
        yield from (depth, age, tasks, live)


class _Process:
    """This process's own metrics (the module's, and prometheus-client's process, platform and GC collectors)."""

    def collect(self):
        yield from REGISTRY.collect()


def exposition(settings: Settings) -> tuple[bytes, str]:
    """The text a scrape gets, and its content type."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)  # every process's files in the folder, summed
    else:
        registry.register(_Process())
    registry.register(CatalogCollector(settings))
    return generate_latest(registry), CONTENT_TYPE_LATEST
