"""The files and folders processes work in under a host's work dir (``Settings.work_dir``), and the mark that says
one is in use: an advisory ``flock`` its process holds for as long as it uses it.

The kernel drops the lock when the process dies however it dies, so the garbage collector can tell a leftover of a
crashed API or killed worker (no one holds it) from one in use, without guessing from ages. Locks taken through
different ``open`` calls exclude each other even within one process, so a sweep in the API process sees the API's
own uploads as in use.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from enginefarm.core.config import Settings

SPOOL_FOLDER, SPOOL_PREFIX = "uploads", "upload-"  # <work_dir>/uploads/upload-*: uploads the API is receiving
SCRATCH_PREFIX = "build-"  # <work_dir>/build-*: one build's, benchmark's or upload inspection's scratch folder


def hold(path: Path) -> int:
    """Take the lock on ``path`` (a file or a folder) for the caller; returns the descriptor to close when done."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


@contextmanager
def unused(path: Path) -> Iterator[bool]:
    """True, holding the lock for the block, when no process holds ``path``; False when one does or it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


class Scratch:
    """A private scratch directory for one build, removed afterwards whatever happens. It stays locked
    (see above) while in use, so the garbage collector removes only those a killed process left."""

    def __init__(self, settings: Settings):
        settings.work_dir.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(dir=settings.work_dir, prefix=SCRATCH_PREFIX))
        self._lock: int | None = hold(self.path)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        try:
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            release(self._lock)
            self._lock = None
