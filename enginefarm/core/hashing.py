"""sha256 of a file, and a writer that hashes and counts what passes through it (one pass for copy and hash)."""

from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path
from typing import Any, BinaryIO

CHUNK = 1 << 20
# The header a blob's bytes travel with: their sha256, for the receiver to check (also the ETag).
SHA_HEADER = "X-Content-SHA256"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class HashingWriter(io.RawIOBase):
    """A binary file that hashes and counts what is written through it to ``fh``."""

    def __init__(self, fh: BinaryIO | io.RawIOBase):
        super().__init__()
        self._fh = fh
        self._digest = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._digest.update(view)
        self._fh.write(view)
        self.size += len(view)
        return len(view)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def restart(self) -> None:
        """Start again from nothing: empty the file and the hash."""
        self._fh.seek(0)
        self._fh.truncate()
        self._digest = hashlib.sha256()
        self.size = 0


def copy_hashed(src: BinaryIO, dst: BinaryIO | io.RawIOBase) -> str:
    """Copy ``src`` to ``dst``; return the sha256 of what was written."""
    out = HashingWriter(dst)
    shutil.copyfileobj(src, out, CHUNK)
    return out.hexdigest()
