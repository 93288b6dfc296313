"""Metrics the storage layer counts itself: the API and the workers expose them (``api.metrics``,
``worker.process.metrics``)."""

from __future__ import annotations

from prometheus_client import Counter

BLOB_ERRORS = Counter(
    "enginefarm_blob_store_errors_total", "Blob store operations that failed, other than a missing key", ["store"]
)
