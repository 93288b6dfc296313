"""Database engine, sessions and migrations for the catalog."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar, overload

import orjson
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from enginefarm.core.config import Settings, get_settings
from storage.generation import after_commit, before_flush

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
T = TypeVar("T")
# How long a worker keeps retrying a catalog write while the database is unavailable (a restart, a failover).
PATIENCE_S = 300.0
MIGRATION_LOCK = 0x656E67696E65  # a PostgreSQL advisory lock key of our own ("engine")


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL lets the API read while a worker writes; busy_timeout makes writers wait, not fail.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def uses_sqlite(settings: Settings) -> bool:
    """The embedded catalog: one host, file locks beside it instead of PostgreSQL advisory locks."""
    return settings.resolved_database_url.startswith("sqlite")


def advisory_key(namespace: str, name: str) -> int:
    """A signed 64-bit number for ``name`` in ``namespace`` (PostgreSQL's advisory lock space); a file lock beside
    a SQLite catalog uses it to name its file."""
    return int.from_bytes(hashlib.sha256(f"enginefarm-{namespace}:{name}".encode()).digest()[:8], "big", signed=True)


def lock_file(settings: Settings, name: str) -> Path:
    """The path of a lock file beside the catalog (its folder made)."""
    folder = settings.data_dir / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def json_loads(data: str | bytes):
    """JSON columns read with orjson, four times faster than the standard library: a resolve reads two per engine.
    A value orjson refuses (NaN, which Python's json writes and SQLite keeps) is read by the standard library."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, json_deserializer=json_loads
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # Up to 40 at once: the API's 40 route threads hold at most one each; a session being ended gives its
    # connection back on threads of its own (api/http/deps.py), so a route waiting here never waits on itself.
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=30, json_deserializer=json_loads)


@lru_cache
def _engine_for(url: str) -> Engine:
    return make_engine(url)


def get_engine(settings: Settings | None = None) -> Engine:
    return _engine_for((settings or get_settings()).resolved_database_url)


@lru_cache
def _sessionmaker_for(url: str) -> sessionmaker[Session]:
    maker = sessionmaker(bind=_engine_for(url), expire_on_commit=False)
    event.listen(maker, "before_flush", before_flush)
    event.listen(maker, "after_commit", after_commit)
    return maker


def new_session(settings: Settings | None = None) -> Session:
    """A session of the catalog; it takes a connection from the pool at its first query."""
    return _sessionmaker_for((settings or get_settings()).resolved_database_url)()


QUICK_CONNECTIONS = 8  # per API process: more reads at once than this machine has cores to judge them


@lru_cache
def _quick_engine_for(url: str) -> Engine:
    if url.startswith("sqlite"):
        return _engine_for(url)
    # No overflow: a read beyond QUICK_CONNECTIONS at once waits for a connection rather than opening one that is
    # closed after its single use (a backend started and ended, its statements planned afresh).
    return create_engine(
        url,
        pool_size=QUICK_CONNECTIONS,
        max_overflow=0,
        pool_timeout=30,
        isolation_level="AUTOCOMMIT",
        json_deserializer=json_loads,
    )


@contextmanager
def quick_read(settings: Settings) -> Iterator[Session]:
    """A session for one short read whose caller has a full path to fall back on when it fails: no ping before
    each checkout and no transaction around the query, so one round trip to PostgreSQL instead of four. A
    connection that died (a database restart) fails the read once, is discarded, and the caller takes its full
    path, whose pool pings."""
    session = Session(bind=_quick_engine_for(settings.resolved_database_url))
    try:
        yield session
    finally:
        session.close()


@contextmanager
def session_scope(settings: Settings | None = None) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error."""
    session = new_session(settings)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# The database restarting or briefly unreachable; not a constraint or a bug.
UNAVAILABLE = (OperationalError, InterfaceError)


def with_patience(fn: Callable[[], T], patience_s: float = PATIENCE_S) -> T:
    """Run ``fn()`` again and again with backoff while the database is unavailable (up to ``patience_s``)."""
    return retry(
        retry=retry_if_exception_type(UNAVAILABLE),
        wait=wait_exponential(multiplier=0.5, max=15),
        stop=stop_after_delay(patience_s),
        reraise=True,
    )(fn)()


def in_transaction(
    fn: Callable[..., T], *args: Any, settings: Settings | None = None, patience_s: float = PATIENCE_S, **kwargs: Any
) -> T:
    """Run ``fn(session, *args, **kwargs)`` in its own transaction, again and again with backoff while the
    database is unavailable (up to ``patience_s``). For the worker, whose writes must land once the database
    is back: a task's final state lost to a restart would leave its row running forever."""

    def attempt() -> T:
        with session_scope(settings) as session:
            return fn(session, *args, **kwargs)

    return with_patience(attempt, patience_s)


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def migrate(settings: Settings | None = None) -> None:
    """Bring the catalog's schema to the newest revision (idempotent)."""
    from alembic import command

    settings = settings or get_settings()
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        command.upgrade(alembic_config(url), "head")
        return
    # Several API processes (uvicorn --workers) and workers start at once: one migrates, the others wait.
    with get_engine(settings).connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
        try:
            command.upgrade(alembic_config(url), "head")
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})


def ping(settings: Settings) -> None:
    """One round trip to the catalog's database; raises what the driver raises when it is not there."""
    with session_scope(settings) as s:
        s.execute(text("SELECT 1"))


def has_catalog(settings: Settings) -> bool:
    """Whether the settings' database already holds a catalog (a farm has used it), without making one."""
    url = settings.resolved_database_url
    if url.startswith("sqlite") and not (settings.data_dir / "catalog.db").exists() and settings.database_url is None:
        return False
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return inspect(conn).has_table("alembic_version")
    finally:
        engine.dispose()


@overload
def as_utc(value: datetime) -> datetime: ...
@overload
def as_utc(value: None) -> None: ...
@overload
def as_utc(value: datetime | None) -> datetime | None: ...
def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every time the catalog stores is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)
