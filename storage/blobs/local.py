"""A blob store in a local directory: the embedded default."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from enginefarm.errors import IntegrityError, NotFound
from storage.blobs.base import CHUNK, BlobStore, sha256_file


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

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        final = self._path(key)
        if (final.exists() and final.stat().st_size == Path(path).stat().st_size
                and sha256_file(final) == sha256):
            return  # the same key already holds these bytes (verified, as the interface promises)
        final.parent.mkdir(parents=True, exist_ok=True)
        # Copy to a temp file beside the final name, verify, then rename: readers never see a half blob.
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".incoming-")
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                while chunk := src.read(CHUNK):  # hash what is written, in the same pass
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            got = digest.hexdigest()
            if got != sha256:
                raise IntegrityError(f"blob {key}: wrote sha256 {got}, expected {sha256}")
            os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def get_file(self, key: str, dest: Path) -> None:
        src = self._path(key)
        if not src.exists():
            raise NotFound(f"blob {key} is missing from the store")
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as out, open(src, "rb") as fh:
                shutil.copyfileobj(fh, out, CHUNK)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def iter_chunks(self, key: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        path = self._path(key)
        if not path.exists():
            raise NotFound(f"blob {key} is missing from the store")
        with open(path, "rb") as fh:
            while chunk := fh.read(chunk_size):
                yield chunk

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def keys(self, prefix: str = "") -> Iterator[str]:
        for path in sorted(self.root.rglob("*")):
            if path.is_file() and not path.name.startswith(".incoming-"):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    yield key
