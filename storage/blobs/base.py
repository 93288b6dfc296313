"""The blob store interface. Keys are content addresses: the same bytes always get the same key."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from enginefarm.core.hashing import CHUNK


def model_key(sha256: str) -> str:
    return f"models/{sha256[:2]}/{sha256}"


def engine_key(sha256: str) -> str:
    return f"engines/{sha256[:2]}/{sha256}"


def samples_key(sha256: str) -> str:
    return f"samples/{sha256[:2]}/{sha256}"


def reference_key(sha256: str) -> str:
    return f"references/{sha256[:2]}/{sha256}"


@dataclass(frozen=True)
class BlobObject:
    """One complete object as a listing sees it; ``modified`` (UTC) is when it was last written or refreshed."""

    key: str
    size: int
    modified: datetime


@dataclass(frozen=True)
class PartialUpload:
    """What an interrupted write left behind: never readable under a key, it only takes space.

    ``key`` names it within the store (a temp file's path, or the key an S3 multipart upload was
    for), ``upload_id`` is the S3 multipart upload id, and ``modified`` (UTC) is its last progress.
    """

    key: str
    size: int
    modified: datetime
    upload_id: str | None = None


class BlobStore(ABC):
    """Where model and engine bytes live. Writes are idempotent and verified before they return."""

    @abstractmethod
    def put_file(self, key: str, path: Path, sha256: str, *, hashed: bool = False) -> None:
        """Store ``path`` under ``key``; returns only once the stored bytes are complete and match ``sha256``.

        ``hashed``: the caller computed ``sha256`` over this very file (the upload spool hashes as it writes), so
        it is not read again to check it; a local store links the file into place instead of copying it.

        When the key already holds these bytes nothing is copied, but the object's modified time is
        refreshed: a new row is about to point at it, and the garbage collector's grace period must
        protect it from now on, not from whenever an earlier (perhaps orphaned) write stored it.
        """

    @abstractmethod
    def get_file(self, key: str, dest: Path) -> None:
        """Write the blob to ``dest`` atomically (never a half file under that name)."""

    @abstractmethod
    def iter_chunks(
        self, key: str, chunk_size: int = CHUNK, start: int = 0, end: int | None = None
    ) -> Generator[bytes, None, None]:
        """Stream the blob's bytes, from ``start`` up to and including ``end`` (default: to the last); a generator,
        which a reader that stops early closes."""

    def link_file(self, key: str, dest: Path) -> bool:
        """Put the blob under ``dest`` as a hard link, where this store keeps it on the same file system: no copy,
        for a reader that never writes the file in place (a store writes a blob anew and renames it over the old
        name). False where it cannot; the caller copies with ``get_file``. Raises NotFound when it is missing."""
        return False

    def local_path(self, key: str) -> Path | None:
        """The blob's file, where the store keeps it on this host's disk (served without copying); else None.
        Raises NotFound when it is missing."""
        return None

    def download_url(self, key: str, expires_seconds: int, filename: str | None = None) -> str | None:
        """A URL a client may fetch the blob from directly for ``expires_seconds`` (S3: presigned; its answer
        names ``filename`` in Content-Disposition), or None."""
        return None

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def objects(self, prefix: str = "") -> Iterator[BlobObject]:
        """Every complete object whose key starts with ``prefix``, with its size and modified time."""

    @abstractmethod
    def stat(self, key: str) -> BlobObject | None:
        """The object under ``key`` as it is now, or None when there is none."""

    def keys(self, prefix: str = "") -> Iterator[str]:
        return (obj.key for obj in self.objects(prefix))

    def partial_uploads(self) -> Iterator[PartialUpload]:
        """What interrupted writes left behind (temp files, unfinished multipart uploads); none by default."""
        return iter(())

    def discard_partial(self, partial: PartialUpload) -> None:  # noqa: B027 - a store with no partial uploads
        """Remove one of ``partial_uploads()``; one already gone is fine. A write still in progress
        on it then fails instead of storing anything."""
