"""The blob store interface. Keys are content addresses: the same bytes always get the same key."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CHUNK = 1 << 20


def model_key(sha256: str) -> str:
    return f"models/{sha256[:2]}/{sha256}"


def engine_key(sha256: str) -> str:
    return f"engines/{sha256[:2]}/{sha256}"


def samples_key(sha256: str) -> str:
    return f"samples/{sha256[:2]}/{sha256}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class BlobStore(ABC):
    """Where model and engine bytes live. Writes are idempotent and verified before they return."""

    @abstractmethod
    def put_file(self, key: str, path: Path, sha256: str) -> None:
        """Store ``path`` under ``key``; returns only once the stored bytes are complete and match ``sha256``."""

    @abstractmethod
    def get_file(self, key: str, dest: Path) -> None:
        """Write the blob to ``dest`` atomically (never a half file under that name)."""

    @abstractmethod
    def iter_chunks(self, key: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """Stream the blob's bytes."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def keys(self, prefix: str = "") -> Iterator[str]: ...

    @contextmanager
    def put_for_row(self, key: str, path: Path, sha256: str) -> Iterator[None]:
        """Store the blob, then run the block that writes the catalog row pointing at it; if the block
        fails, the blob goes again (unless it was there before), so a failed write leaves nothing behind."""
        was_there = self.exists(key)
        self.put_file(key, path, sha256)
        try:
            yield
        except BaseException:
            if not was_there:
                self.delete(key)
            raise
