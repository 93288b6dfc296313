"""Large files written around the page cache (``O_DIRECT``): engine plans, and a local store's copies, which are
fsynced after and not read again soon, so the fsync has almost nothing left to write.

``DirectFile`` stages what is written through a page-aligned buffer (``O_DIRECT`` needs the address, the length and
the offset aligned to the device's blocks), writes it a stage at a time, pads the last block and cuts the file back
to its length when closed. Where the file system refuses ``O_DIRECT`` (``EINVAL``, at the flag or at the first
write) or the platform has none, it writes the usual way from that point on. Nothing is fsynced here: the caller
does (``LocalBlobStore.put_file``). A worker whose engines go to an S3 store writes its plans the usual way
(``write_plans_direct``), only hashed as written.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import mmap
import os
from pathlib import Path
from typing import Any

_around_cache = False  # write_hashed's way in this process (write_plans_direct)
ALIGN = 4096  # a multiple of every block size O_DIRECT asks for on Linux (512 or 4096)
STAGE = 4 << 20  # bytes staged and written at a time
O_DIRECT = getattr(os, "O_DIRECT", 0)


class DirectFile(io.RawIOBase):
    """A binary file, open for writing on ``fd`` (which it owns and closes), written around the page cache where
    the file system allows. ``size``: the bytes written so far."""

    def __init__(self, fd: int):
        super().__init__()
        self.fd = fd
        self.size = 0
        self._filled = 0
        try:
            self.direct = _direct_on(fd)
            self._stage: mmap.mmap | None = mmap.mmap(-1, STAGE) if self.direct else None  # page-aligned
        except BaseException:
            os.close(fd)  # it is ours from the start
            raise
        self._staged = memoryview(self._stage) if self._stage is not None else None

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data: Any) -> int:
        self._checkClosed()  # io's own check: never a write to a reused fd number
        view = memoryview(data).cast("B")
        written = len(view)
        self.size += written
        while view and self._staged is not None:
            take = min(len(view), STAGE - self._filled)
            self._staged[self._filled : self._filled + take] = view[:take]
            self._filled, view = self._filled + take, view[take:]
            if self._filled == STAGE:
                self._drain(STAGE)
        if view:
            _write_all(self.fd, view)
        return written

    def sync(self) -> None:
        """Write what is staged and fsync: every byte is on disk. Writes after it go on at the end, the usual
        way."""
        self._write_staged()
        os.fsync(self.fd)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._write_staged()
        finally:
            try:
                self._release()
            finally:
                os.close(self.fd)
                super().close()

    def _write_staged(self) -> None:
        if self._staged is not None and self._filled:
            padded = -(-self._filled // ALIGN) * ALIGN
            self._staged[self._filled : padded] = bytes(padded - self._filled)
            self._drain(padded)
            os.ftruncate(self.fd, self.size)  # the last block's padding off
            os.lseek(self.fd, self.size, os.SEEK_SET)  # a later write follows the bytes, unaligned: the usual way

    def _drain(self, length: int) -> None:
        """Write the first ``length`` staged bytes (aligned); a file system that refuses them direct gets them and
        everything after written the usual way."""
        assert self._staged is not None
        done = 0
        while done < length:
            try:
                with self._staged[done:length] as part:  # released even when the write raises
                    done += os.write(self.fd, part)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~O_DIRECT)
                self.direct = False
        self._filled = 0
        if not self.direct:
            self._release()

    def _release(self) -> None:
        if self._staged is not None:
            self._staged.release()
            self._staged = None
        if self._stage is not None:
            self._stage.close()
            self._stage = None


def _direct_on(fd: int) -> bool:
    """Turn ``O_DIRECT`` on for ``fd``; False where the platform or the file system has none."""
    if not O_DIRECT:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    return True


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])


def write_plans_direct(on: bool) -> None:
    """Whether ``write_hashed`` writes around the page cache in this process (and the processes it forks): where
    what it writes is fsynced next (a worker whose engines go to a local store)."""
    global _around_cache
    _around_cache = on


def write_hashed(path: Path, data: Any) -> str:
    """Write ``data`` (any buffer) to ``path``, created or emptied, around the page cache where this process
    chose so (``write_plans_direct``) and the file system allows; return the sha256 of the bytes written."""
    digest = hashlib.sha256(memoryview(data).cast("B")).hexdigest()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    with DirectFile(fd) if _around_cache else open(fd, "wb", closefd=True) as out:
        out.write(data)
    return digest
