"""Writing a blob together with the catalog row that points at it, safe under any interleaving of writers.

Keys are content addresses, so writers of the same bytes (two uploads of one file, two workers that built
the same engine, a derived model made again) share one object. A writer that fails after storing the blob
must not delete it while another writer's row points at it or is about to: that row commits on another
connection, and a check made before the commit sees nothing. So each write runs in a transaction that
holds the key's lock from storing the blob until the row commits (``locked_session``); a write that fails
or turns out not to be needed gives the blob up in a second locked transaction, only if no committed row
points at it. The garbage collector's last look before deleting a key takes the same lock.

The lock is a PostgreSQL transaction-level advisory lock where the catalog is PostgreSQL (processes on any
host; it ends with the transaction, or with the connection of a process that died), and a file lock
beside the catalog where it is SQLite (the embedded farm: every process on one host; the kernel drops it
when its holder dies).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from enginefarm.core.config import Settings
from storage.blobs.base import BlobStore
from storage.db import UNAVAILABLE, advisory_key, lock_file, session_scope, uses_sqlite, with_patience
from storage.tables import EngineRow, ModelRow, ReferenceRow

log = logging.getLogger(__name__)
T = TypeVar("T")

# Every catalog column that holds a blob key. A new column that points at a blob belongs here, or its
# blobs will be collected (tests/e2e/storage/test_gc.py checks that no *_key column is left out).
REFERENCE_COLUMNS = (ModelRow.blob_key, ModelRow.samples_key, EngineRow.blob_key, ReferenceRow.blob_key)

# File locks for a SQLite catalog: one file per stripe, not per key, so they never pile up.
LOCK_STRIPES = 256


def referenced_keys(session: Session) -> set[str]:
    """Every blob key some catalog row points at."""
    keys: set[str] = set()
    for column in REFERENCE_COLUMNS:
        keys.update(session.scalars(select(column).where(column.is_not(None)).distinct()))
    return keys


def is_referenced(session: Session, key: str) -> bool:
    return any(session.scalar(select(column).where(column == key).limit(1)) is not None for column in REFERENCE_COLUMNS)


@contextmanager
def _file_lock(settings: Settings, lock_id: int) -> Iterator[None]:
    with open(lock_file(settings, f"blob-{lock_id % LOCK_STRIPES:03d}.lock"), "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        yield


@contextmanager
def locked_session(settings: Settings, key: str) -> Iterator[Session]:
    """A session whose transaction holds ``key``'s lock until it commits or rolls back."""
    lock_id = advisory_key("blob", key)
    with ExitStack() as stack:
        sqlite = uses_sqlite(settings)
        if sqlite:  # taken before the transaction writes anything, so it never waits on SQLite's own lock
            stack.enter_context(_file_lock(settings, lock_id))
        session = stack.enter_context(session_scope(settings))
        if not sqlite:
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock_id})
        yield session


def give_up_if_unreferenced(settings: Settings, store: BlobStore, key: str) -> bool:
    """Delete ``key``'s blob unless a committed row points at it; returns whether it was deleted. When the
    catalog cannot be asked the blob stays, for the collector to judge later."""
    try:
        with locked_session(settings, key) as s:
            if is_referenced(s, key):
                return False
            store.delete(key)
            return True
    except UNAVAILABLE:
        log.warning("the catalog is unavailable: keeping blob %s for the collector to judge", key)
        return False


def start_flush(path: Path) -> None:
    """Begin putting ``path``'s bytes on disk in a background thread, and return at once.

    A local store links a spooled upload into place and fsyncs it first (``LocalBlobStore.put_file``). Begun
    while the upload is inspected, the writing overlaps the inspection, and that fsync finds it done or under way.
    A file removed meanwhile (a rejected upload) is flushed for nothing, and no harm done."""

    def flush() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass  # the store's own fsync reports the trouble, on the request's path
        finally:
            os.close(fd)

    threading.Thread(target=flush, name="flush-upload", daemon=True).start()


def store_with_row(
    settings: Settings,
    store: BlobStore,
    key: str,
    path: Path,
    sha256: str,
    write: Callable[[Session], T],
    *,
    patience_s: float = 0.0,
) -> T:
    """Store ``path`` under ``key`` and run ``write(session)``, which writes the row pointing at it, in one
    transaction that holds the key's lock; returns what ``write`` returns.

    Storing bytes that are already there refreshes them (the collector's grace starts again), and restores
    them if they went missing, so a ``write`` that finds an existing row (the same bytes uploaded again)
    repairs it. Afterwards the blob stays exactly when a committed row points at it: a write that failed, or
    that found the row it wanted already pointing elsewhere, leaves nothing behind, and never deletes bytes
    another writer's row uses. ``patience_s``: how long to retry while the database is unavailable.
    """

    def attempt() -> T:
        with locked_session(settings, key) as session:
            # Every caller computed sha256 over this very file: the store need not read it again.
            store.put_file(key, path, sha256, hashed=True)
            return write(session)

    try:
        return with_patience(attempt, patience_s) if patience_s else attempt()
    finally:
        give_up_if_unreferenced(settings, store, key)
