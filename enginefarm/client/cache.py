"""The deploy side's local engine cache: content-addressed blobs plus one JSON record per engine.

Layout under the root::

    blobs/<sha[:2]>/<sha256>    the engine bytes, named by their sha256
    engines/<sha256>.json       the engine's catalog record, with ``cached_from`` and ``cached_at``

Every write goes to a temp file in the final directory, is fsynced and then renamed into place,
so readers and other processes never see a half file. Use is recorded in the blob's mtime,
which ``prune`` evicts by (oldest first); atime is not relied on.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from enginefarm.client.safepaths import TMP_PREFIX, atomic_write
from enginefarm.core.errors import IntegrityError, NotFound
from enginefarm.core.hashing import CHUNK, HashingWriter, sha256_file

__all__ = ["TMP_PREFIX", "EngineCache", "HashingWriter", "atomic_write", "check_sha256", "default_cache_dir"]
STALE_TMP_SECONDS = 24 * 3600
_SHA = re.compile(r"[0-9a-f]{64}")


def default_cache_dir() -> Path:
    """``$ENGINEFARM_CACHE_DIR``, else ``$XDG_CACHE_HOME/enginefarm``, else ``~/.cache/enginefarm``."""
    if explicit := os.environ.get("ENGINEFARM_CACHE_DIR"):
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore a relative path
        return Path(xdg) / "enginefarm"
    return Path.home() / ".cache" / "enginefarm"


def check_sha256(sha256: Any) -> str:
    """Return ``sha256`` if it is 64 lowercase hex digits; raise ValueError otherwise."""
    if not isinstance(sha256, str) or not _SHA.fullmatch(sha256):
        raise ValueError(f"not a sha256 (64 lowercase hex digits): {sha256!r}")
    return sha256


class EngineCache:
    """Engines already downloaded on this machine, keyed by sha256."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.blobs = self.root / "blobs"
        self.engines = self.root / "engines"

    def path(self, sha256: str) -> Path:
        """Where the blob for ``sha256`` lives (whether or not it is there)."""
        sha = check_sha256(sha256)
        return self.blobs / sha[:2] / sha

    def _record_path(self, sha256: str) -> Path:
        return self.engines / f"{check_sha256(sha256)}.json"

    def _touch(self, path: Path) -> None:
        with suppress(OSError):  # a read-only cache still serves
            os.utime(path)

    def has(self, sha256: str, verify: bool = True) -> bool:
        """Whether the blob is cached; with ``verify``, a blob of the wrong size or digest is evicted."""
        path = self.path(sha256)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        if verify:
            want = (self.record(sha256) or {}).get("size")
            if (isinstance(want, int) and size != want) or sha256_file(path) != sha256:
                self.evict(sha256)
                return False
        self._touch(path)
        return True

    @contextmanager
    def writer(self, sha256: str, size: int | None = None) -> Iterator[io.RawIOBase]:
        """Yield a binary file to stream the engine into; it lands under ``path(sha256)`` only if the digest (and
        ``size``, when given) match."""
        final = self.path(sha256)
        with atomic_write(final, sha256, size=size) as out:
            yield out
        self._touch(final)

    def copy_to(self, sha256: str, dest: Path) -> Path:
        """Copy the cached blob to ``dest`` atomically, verifying the copy; a corrupt blob is evicted."""
        src, dest = self.path(sha256), Path(dest)
        try:
            fh = open(src, "rb")  # noqa: SIM115 - closed by the code below, which hands it on
        except FileNotFoundError:
            raise NotFound(f"engine {sha256} is not in the cache at {self.root}", sha256=sha256) from None
        try:
            with fh, atomic_write(dest, sha256, prefix=f".{dest.name}{TMP_PREFIX}") as out:
                shutil.copyfileobj(fh, out, CHUNK)
        except IntegrityError:
            self.evict(sha256)
            raise
        self._touch(src)
        return dest

    def remember(self, record: dict[str, Any], source: str) -> None:
        """Store the engine's catalog record, with the farm URL it came from and the time."""
        doc = {**record, "cached_from": source, "cached_at": datetime.now(timezone.utc).isoformat()}
        data = json.dumps(doc, indent=2, sort_keys=True, default=str).encode()
        with atomic_write(self._record_path(str(record.get("sha256"))), None) as out:
            out.write(data)

    def _answer_path(self, question: str) -> Path:
        return self.root / "answers" / f"{hashlib.sha256(question.encode()).hexdigest()}.json"

    def answer(self, question: str) -> tuple[str, dict[str, Any]] | None:
        """The farm's last answer to this question (a resolve request as JSON) and its ETag, if kept."""
        doc = _read_json(self._answer_path(question))
        if doc is None or doc.get("question") != question or not isinstance(doc.get("answer"), dict):
            return None
        return str(doc.get("etag")), doc["answer"]

    def keep_answer(self, question: str, etag: str, answer: dict[str, Any]) -> None:
        """Keep an answer to ask with If-None-Match next time: a 304 then costs the farm nearly nothing."""
        data = json.dumps({"question": question, "etag": etag, "answer": answer}).encode()
        with suppress(OSError):  # a read-only cache still serves
            with atomic_write(self._answer_path(question), None) as out:
                out.write(data)

    def record(self, sha256: str) -> dict[str, Any] | None:
        """The stored record for ``sha256``, or None when absent or unreadable."""
        return _read_json(self._record_path(sha256))

    def records(self, model: str | None = None, version: str | None = None) -> list[dict[str, Any]]:
        """Stored records, optionally of one model and version (with the engines of models derived from that
        version, its variants); unreadable files are skipped."""
        found = []
        for path in sorted(self.engines.glob("*.json")) if self.engines.is_dir() else []:
            if not _SHA.fullmatch(path.stem) or (doc := _read_json(path)) is None:
                continue
            versions = (None, doc.get("model_version"), doc.get("variant_of"))
            if model in (None, doc.get("model_name")) and version in versions:
                found.append(doc)
        return found

    def evict(self, sha256: str) -> bool:
        """Delete the blob and record for ``sha256``; returns whether anything was there."""
        removed = False
        for path in (self.path(sha256), self._record_path(sha256)):
            with suppress(FileNotFoundError):
                path.unlink()
                removed = True
        return removed

    def _blobs(self) -> Iterator[tuple[Path, os.stat_result]]:
        """Complete blobs with their stat; temp files of writes in progress are not listed."""
        for path in self.blobs.glob("??/*") if self.blobs.is_dir() else []:
            if _SHA.fullmatch(path.name) and path.parent.name == path.name[:2]:
                try:
                    yield path, path.stat()
                except FileNotFoundError:  # evicted meanwhile
                    continue

    def size_bytes(self) -> int:
        """Total size of the complete blobs."""
        return sum(st.st_size for _, st in self._blobs())

    def prune(self, max_bytes: int) -> list[str]:
        """Evict least recently used blobs until they total at most ``max_bytes``; returns the evicted shas."""
        now = time.time()
        for tmp in self.blobs.glob(f"??/{TMP_PREFIX}*") if self.blobs.is_dir() else []:
            with suppress(FileNotFoundError):
                if now - tmp.stat().st_mtime > STALE_TMP_SECONDS:  # left by a writer that died
                    tmp.unlink()
        blobs = sorted(self._blobs(), key=lambda item: (item[1].st_mtime_ns, item[0].name))
        total = sum(st.st_size for _, st in blobs)
        evicted = []
        for path, st in blobs:
            if total <= max_bytes:
                break
            self.evict(path.name)
            total -= st.st_size
            evicted.append(path.name)
        return evicted


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
