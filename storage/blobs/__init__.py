"""Blob stores: one small interface (base.py), one file per implementation."""

from __future__ import annotations

import threading

from enginefarm.core.config import Settings, get_settings
from storage.blobs.base import BlobStore, engine_key, model_key, reference_key, samples_key


def get_blob_store(settings: Settings | None = None) -> BlobStore:
    """The blob store the settings name: S3 in distributed mode, a local directory otherwise. One per
    configuration and process: a boto3 client is thread-safe, and making one costs more than a download."""
    settings = settings or get_settings()
    fields = ("blob_store", "s3_endpoint_url", "s3_bucket", "s3_region", "s3_access_key", "s3_secret_key")
    return _store_for(tuple(getattr(settings, f) for f in fields) + (settings.resolved_blob_dir,), settings)


_stores: dict[tuple, BlobStore] = {}
_lock = threading.Lock()


def _store_for(key: tuple, settings: Settings) -> BlobStore:
    with _lock:
        if key not in _stores:
            if settings.blob_store == "s3":
                from storage.blobs.s3 import S3BlobStore

                _stores[key] = S3BlobStore.from_settings(settings)
            else:
                from storage.blobs.local import LocalBlobStore

                _stores[key] = LocalBlobStore(settings.resolved_blob_dir)
        return _stores[key]


__all__ = ["BlobStore", "engine_key", "get_blob_store", "model_key", "reference_key", "samples_key"]
