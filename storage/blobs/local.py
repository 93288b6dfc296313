"""A blob store in a local directory: the embedded default."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Generator, Iterator
from datetime import datetime, timezone
from pathlib import Path

from enginefarm.core.directwrite import DirectFile
from enginefarm.core.errors import IntegrityError, NotFound
from enginefarm.core.hashing import copy_hashed, sha256_file
from storage.blobs.base import CHUNK, BlobObject, BlobStore, PartialUpload

TMP_PREFIX = ".incoming-"  # a write in progress, or one a crash interrupted: never a blob


def _utc(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, timezone.utc)


class LocalBlobStore(BlobStore):
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if ".." in key.split("/"):  # even one that stays inside would name another key's file
            raise ValueError(f"blob key {key!r} may not contain '..'")
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"blob key {key!r} escapes the store")
        return path

    def put_file(self, key: str, path: Path, sha256: str, *, hashed: bool = False) -> None:
        final = self._path(key)
        if final.exists() and final.stat().st_size == Path(path).stat().st_size and sha256_file(final) == sha256:
            try:  # the same key already holds these bytes (verified, as the interface promises)
                os.utime(final)  # a new row will point at it: restart the collector's grace period
                return
            except FileNotFoundError:
                pass  # collected since the check: write it again
        final.parent.mkdir(parents=True, exist_ok=True)
        if hashed and self._link(Path(path), final):
            return
        # Copy to a temp file beside the final name, verify, then rename: readers never see a half blob.
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=TMP_PREFIX)
        try:
            with DirectFile(fd) as out, open(path, "rb") as src:
                got = copy_hashed(src, out)  # hash what is written, in the same pass
                out.sync()
            if got != sha256:
                raise IntegrityError(f"blob {key}: wrote sha256 {got}, expected {sha256}")
            os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @staticmethod
    def _link(path: Path, final: Path) -> bool:
        """Put ``path``'s bytes under ``final`` with no copy, once they are on disk. False where the file system
        cannot (another device, no hard links): the caller copies instead."""
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)  # the bytes are on disk before any row points at them
            finally:
                os.close(fd)
        except OSError:
            return False
        return _link_as(path, final)

    def link_file(self, key: str, dest: Path) -> bool:
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        return _link_as(self.local_path(key), dest)

    def _open(self, key: str):
        """The blob opened for reading; NotFound, as S3 answers, when it is not there (never a FileNotFoundError)."""
        try:
            return open(self._path(key), "rb")
        except (FileNotFoundError, IsADirectoryError):
            raise NotFound(f"blob {key} is missing from the store") from None

    def get_file(self, key: str, dest: Path) -> None:
        with self._open(key) as fh:
            dest = Path(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=TMP_PREFIX)
            try:
                with DirectFile(fd) as out:
                    shutil.copyfileobj(fh, out, CHUNK)
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

    def iter_chunks(
        self, key: str, chunk_size: int = CHUNK, start: int = 0, end: int | None = None
    ) -> Generator[bytes, None, None]:
        with self._open(key) as fh:
            fh.seek(start)
            left = None if end is None else end - start + 1
            while left is None or left > 0:
                chunk = fh.read(chunk_size if left is None else min(chunk_size, left))
                if not chunk:
                    return
                left = None if left is None else left - len(chunk)
                yield chunk

    def local_path(self, key: str) -> Path:
        path = self._path(key)
        if not path.is_file():
            raise NotFound(f"blob {key} is missing from the store")
        return path

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        found = self.stat(key)
        if found is None:
            raise NotFound(f"blob {key} is missing from the store")
        return found.size

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def objects(self, prefix: str = "") -> Iterator[BlobObject]:
        folder = prefix.rpartition("/")[0]
        if folder:
            self._path(folder)  # the same checks as a key: a prefix may not leave the store either
        start = self.root / folder if folder else self.root
        if not start.is_dir():
            return
        for path in sorted(start.rglob("*")):
            if path.name.startswith(TMP_PREFIX):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:  # deleted since the directory was read
                continue
            key = path.relative_to(self.root).as_posix()
            if stat.S_ISREG(st.st_mode) and key.startswith(prefix):
                yield BlobObject(key, st.st_size, _utc(st.st_mtime))

    def stat(self, key: str) -> BlobObject | None:
        try:
            st = self._path(key).stat()
        except FileNotFoundError:
            return None
        return BlobObject(key, st.st_size, _utc(st.st_mtime)) if stat.S_ISREG(st.st_mode) else None

    def partial_uploads(self) -> Iterator[PartialUpload]:
        """The temp files of writes in progress or interrupted; a live write keeps its file's mtime fresh."""
        for path in sorted(self.root.rglob(f"{TMP_PREFIX}*")):
            try:
                st = path.stat()
            except FileNotFoundError:  # the write finished (renamed) or gave up meanwhile
                continue
            if stat.S_ISREG(st.st_mode):
                yield PartialUpload(path.relative_to(self.root).as_posix(), st.st_size, _utc(st.st_mtime))

    def discard_partial(self, partial: PartialUpload) -> None:
        path = self._path(partial.key)
        if not path.name.startswith(TMP_PREFIX):
            raise ValueError(f"{partial.key!r} is not a temp file: refusing to discard it as a partial upload")
        # A writer still holding it open fails at its rename, so no blob is ever stored from it.
        path.unlink(missing_ok=True)


def _link_as(path: Path, final: Path) -> bool:
    """``path`` also under ``final``: a hard link beside it, renamed into place (never a half file under that
    name). False where the file system cannot (another device, no hard links)."""
    tmp = final.parent / f"{TMP_PREFIX}{secrets.token_hex(8)}"
    try:
        os.link(path, tmp)
    except OSError:
        return False
    try:
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return True
