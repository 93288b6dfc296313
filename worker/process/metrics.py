"""Prometheus metrics of a worker: build and benchmark seconds per target.

Celery's pool children observe them, so they are kept in prometheus-client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``). On one host with the API (``enginefarm up``) the API's /metrics includes them; a
worker on a host of its own serves them with ``enginefarm worker --metrics-port``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
BUILD_SECONDS = Histogram(
    "enginefarm_build_seconds", "Engine build time (the builder's own), by target", ["target"], buckets=BUCKETS
)
BENCHMARK_SECONDS = Histogram(
    "enginefarm_benchmark_seconds", "Benchmark and accuracy check time, by target", ["target"], buckets=BUCKETS
)


def serve(port: int, host: str = "0.0.0.0") -> None:
    """Serve every process's metrics in the multiprocess folder on ``port`` (a thread of this process)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    start_http_server(port, addr=host, registry=registry)
