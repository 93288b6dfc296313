"""One process of the farm at a time runs a background job: the reconciler and the blob sweep start in every
API process (``uvicorn --workers N``, several API hosts), and only the one that holds the job's lock works.

The lock is a PostgreSQL session-level advisory lock on a connection the holder keeps open where the catalog is
PostgreSQL (any host), and a file lock beside the catalog where it is SQLite (one host). Either ends with its
holder, however it dies, and another process takes the job over at its next try.
"""

from __future__ import annotations

import fcntl
import logging
import os
from typing import IO

from sqlalchemy import Connection, text

from enginefarm.core.config import Settings
from storage.db import UNAVAILABLE, advisory_key, get_engine, lock_file, uses_sqlite

log = logging.getLogger(__name__)


class Leadership:
    """Whether this process runs ``job`` now. ``held()`` takes the lock when it is free and keeps it after."""

    def __init__(self, settings: Settings, job: str):
        self.settings, self.job = settings, job
        self._conn: Connection | None = None
        self._file: IO[bytes] | None = None
        self._key = advisory_key("job", job)

    def held(self) -> bool:
        return self._held_file() if uses_sqlite(self.settings) else self._held_pg()

    def _held_file(self) -> bool:
        if self._file is not None:
            return True
        fh = open(lock_file(self.settings, f"job-{self.job}.lock"), "a+b")  # noqa: SIM115 - held open as the lock, closed below
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return False
        self._file = fh
        log.info("process %d runs the %s", os.getpid(), self.job)
        return True

    def _held_pg(self) -> bool:
        try:
            if self._conn is not None:
                self._conn.execute(text("SELECT 1"))  # still connected, so still holding it
                return True
            conn = get_engine(self.settings).connect()
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self._key}).scalar()
            conn.commit()
            if not got:
                conn.close()
                return False
            self._conn = conn
            log.info("process %d runs the %s", os.getpid(), self.job)
            return True
        except UNAVAILABLE:  # the database went away, and the lock with the connection: try again next time
            self._drop()
            return False

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()  # never back to the pool: a connection that held a lock is not reused
            except Exception:  # noqa: BLE001 - it is gone either way
                pass

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                self._conn.commit()
            except UNAVAILABLE:
                pass
            self._drop()
