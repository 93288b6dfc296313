"""A number that moves whenever any process commits a change to what /v1/resolve answers.

An API process keeps the version rows and generations it read (``api.services.versions``) while this number
stands still, so a fleet's repeated question is answered without a query:

- **PostgreSQL**: a commit that changes a model row or raises a generation sends ``NOTIFY enginefarm_resolve``
  (``storage.generation``); a thread of each API process listens and counts the notifications. A notification
  arrives within milliseconds of its commit. While the listening connection is down the number is unknown
  (``None``), and nothing kept is trusted; on reconnecting it moves, since anything may have changed meanwhile.
- **SQLite** (the embedded farm): ``PRAGMA data_version`` on a connection of its own, which moves with every
  commit of any other connection, in any process; exact, and a read of shared memory, not of the file.

Either way the number also counts this process's own commits (``storage.generation.local_changes``).

A second number, ``builds()``, moves whenever a build's progress may have changed: a build, a build task, a
benchmark task, an engine, a benchmark or a verdict written (what ``GET /v1/builds/{id}`` shows). A client waiting
for a build (``?wait=``) is answered as soon as it moves. On PostgreSQL a trigger on each of those tables sends
``NOTIFY enginefarm_builds`` for any statement that writes them (migration 0012: bulk updates and raw SQL
included); on SQLite it is the same ``data_version``. It is a hint to look again, never trusted on its own.

Revocations (``watch_revocations``): on PostgreSQL a revocation's commit sends ``NOTIFY enginefarm_tokens`` with
the token's id (``storage.tokens.revoke_token``), whoever revoked it (any API process, ``enginefarm token
revoke``), and the listening thread hands the id to the API's token cache, which drops it at once. Whenever the
feed starts listening again it hands over "forget everything": a revocation may have gone unheard meanwhile. On
SQLite a revocation by another process reaches a cache by time only (``api.http.auth.TokenCache``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable

from sqlalchemy.engine import make_url

from storage.generation import CHANNEL, local_changes
from storage.tokens import TOKENS_CHANNEL

log = logging.getLogger(__name__)

BUILDS_CHANNEL = "enginefarm_builds"  # notified by migration 0012's triggers


class Changes:
    """``current()``: a token that is equal between two calls only if nothing changed in between; None: unknown
    (this base, for a database with no feed: nothing kept is ever trusted)."""

    def current(self) -> tuple | None:
        return None

    def builds(self) -> tuple | None:
        """A token that moves when a build's progress may have changed; None: unknown (look again by time)."""
        return None

    def watch_revocations(self, forget: Callable[[int], None], forget_all: Callable[[], None]) -> None:
        """Call ``forget(token_id)`` for every revocation any process commits from now on, and ``forget_all()``
        whenever one may have gone unheard; a feed that cannot tell does nothing."""

    def stop(self) -> None:
        pass


class SqliteChanges(Changes):
    def __init__(self, path: str):
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()

    def current(self) -> tuple | None:
        try:
            with self._lock:
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return None
        return (local_changes(), version)

    def builds(self) -> tuple | None:
        return self.current()  # any commit of any connection moves data_version

    def stop(self) -> None:
        self._conn.close()


class PostgresChanges(Changes):
    """Counts ``NOTIFY enginefarm_resolve`` and ``NOTIFY enginefarm_builds`` apart, on a connection of its own, in
    a daemon thread that reconnects."""

    def __init__(self, url: str, retry_s: float = 1.0):
        self._dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._retry_s = retry_s
        self._count = 0
        self._builds = 0
        self._listening = False
        self._revocations: list[tuple[Callable[[int], None], Callable[[], None]]] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resolve-changes", daemon=True)
        self._thread.start()

    def current(self) -> tuple | None:
        return (local_changes(), self._count) if self._listening else None

    def builds(self) -> tuple | None:
        return (self._builds,) if self._listening else None

    def watch_revocations(self, forget: Callable[[int], None], forget_all: Callable[[], None]) -> None:
        self._revocations.append((forget, forget_all))
        # Listening before the first request is served (the API's start-up calls this), so that the first
        # connection's "forget everything" drops nothing a request has just looked up.
        self.wait_listening(5.0)
        forget_all()  # whatever was kept before the watch began was not watched

    def _revoked(self, payload: str) -> None:
        try:
            token_id = int(payload)
        except ValueError:
            log.warning("token revocation with a payload that is no token id: %r", payload[:40])
            return
        for forget, _ in self._revocations:
            forget(token_id)

    def wait_listening(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while not self._listening and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._listening

    def _run(self) -> None:
        import psycopg

        while not self._stopped.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    conn.execute(f"LISTEN {BUILDS_CHANNEL}")
                    conn.execute(f"LISTEN {TOKENS_CHANNEL}")
                    self._count += 1  # anything may have changed while nobody listened
                    self._builds += 1
                    for _, forget_all in self._revocations:
                        forget_all()
                    self._listening = True
                    while not self._stopped.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.channel == BUILDS_CHANNEL:
                                self._builds += 1
                            elif note.channel == TOKENS_CHANNEL:
                                self._revoked(note.payload)
                            else:
                                self._count += 1
            except Exception:  # the database restarting: nothing kept is trusted until listening again
                log.debug("resolve change feed: reconnecting", exc_info=True)
            self._listening = False
            self._stopped.wait(self._retry_s)

    def stop(self) -> None:
        self._stopped.set()


def changes_for(url: str) -> Changes:
    """The change feed of the catalog at this SQLAlchemy URL."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        return SqliteChanges(parsed.database)
    if parsed.get_backend_name() == "postgresql":
        return PostgresChanges(url)
    return Changes()
