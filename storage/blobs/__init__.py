"""Blob stores: one small interface (base.py), one file per implementation."""

from __future__ import annotations

from enginefarm.config import Settings, get_settings
from storage.blobs.base import BlobStore, engine_key, model_key, samples_key


def get_blob_store(settings: Settings | None = None) -> BlobStore:
    """The blob store the settings name: S3 in distributed mode, a local directory otherwise."""
    settings = settings or get_settings()
    if settings.blob_store == "s3":
        from storage.blobs.s3 import S3BlobStore

        return S3BlobStore.from_settings(settings)
    from storage.blobs.local import LocalBlobStore

    return LocalBlobStore(settings.resolved_blob_dir)


__all__ = ["BlobStore", "engine_key", "get_blob_store", "model_key", "samples_key"]
