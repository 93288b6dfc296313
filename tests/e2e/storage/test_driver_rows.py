"""The resolver's reads on the driver's cursor (``storage.driverrows``) give what SQLAlchemy's execution gives, row
for row, by position and by name; its errors are SQLAlchemy's, and a connection that died is invalidated, as the
resolve route's retry expects. On PostgreSQL, where it runs; on SQLite, where it hands the statement back."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError

from storage import resolution
from storage.catalog import _models_query
from storage.db import quick_read, session_scope, uses_sqlite
from storage.driverrows import driver_rows
from tests.helpers import catalog_engine, catalog_model

ARCHS = ("sm75", "sm86", "sm89", "sm120", "cpu")


def dialect(settings) -> str:
    return "sqlite" if uses_sqlite(settings) else "postgresql"


@pytest.fixture
def catalog(settings):
    """Two models of the same name (versions 1 and 2), each with engines of several kinds; returns their shas and
    the engine ids."""
    shas = [hashlib.sha256(f"driver-rows-{v}".encode()).hexdigest() for v in (1, 2)]
    with session_scope(settings) as s:
        models = [catalog_model(s, "driver-rows", sha, version=str(v), seq=v) for v, sha in enumerate(shas, 1)]
        ids = [catalog_engine(s, m, arch) for m in models for arch in ARCHS]
    return shas, ids


def both(settings, statement, params):
    """The rows by SQLAlchemy's execution and by ``driver_rows``, as plain tuples, and the driver's own rows with
    the names of the columns."""
    with quick_read(settings) as s:
        rows = s.connection().execute(statement, params).all()
        got = driver_rows(s.connection(), statement, params)
    names = rows[0]._fields if rows else ()
    return [tuple(r) for r in rows], [tuple(r) for r in got], (got, names)


def test_the_resolvers_statements_give_the_same_rows(settings, catalog):
    shas, ids = catalog
    project = {"project": ""}
    for statement, params in (
        (_models_query(False, True, resolution.MODEL_COLUMNS), {"name": "driver-rows", "version": None, **project}),
        (_models_query(True, True, resolution.MODEL_COLUMNS), {"name": "driver-rows", "version": "2", **project}),
        (resolution.KINDS_OF[dialect(settings)], {"shas": shas}),
        (resolution.ENGINES_OF, {"shas": shas, **project}),
        (resolution.ENGINES_BY_ID, {"ids": ids[1:7], **project}),  # its list twice: the subquery's and the outer
        (resolution.ENGINES_BY_ID, {"ids": ids[:1], **project}),
    ):
        expected, got, (rows, names) = both(settings, statement, params)
        assert got == expected and expected, (statement, params)
        assert [tuple(getattr(r, n) for n in names) for r in rows] == expected  # by name as well as by position


def test_an_empty_list_reads_nothing(settings, catalog):
    expected, got, _ = both(settings, resolution.ENGINES_BY_ID, {"ids": [], "project": ""})
    assert got == expected == []


def test_the_same_statement_answers_each_call_with_its_own_values(settings, catalog):
    shas, ids = catalog
    with quick_read(settings) as s:
        for n in (1, 3, 10, 2):
            rows = driver_rows(s.connection(), resolution.ENGINES_BY_ID, {"ids": ids[:n], "project": ""})
            assert sorted(r.id for r in rows) == sorted(ids[:n])


def test_a_watched_connection_runs_through_sqlalchemy(settings, catalog):
    """A listener on the statements (tracing, a test's count) sees every read."""
    seen: list[str] = []
    with quick_read(settings) as s:
        connection = s.connection()
        event.listen(connection, "before_cursor_execute", lambda *args: seen.append(args[2]))
        driver_rows(connection, resolution.KINDS_OF[dialect(settings)], {"shas": catalog[0]})
    assert len(seen) == 1 and "engines" in seen[0]


@pytest.mark.parametrize("settings", ["postgresql"], indirect=True)
def test_a_connection_killed_under_it_is_an_invalidated_dbapi_error(settings, catalog):
    with quick_read(settings) as s:
        connection = s.connection()
        pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        with session_scope(settings) as other:
            assert other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
        with pytest.raises(DBAPIError) as caught:
            driver_rows(connection, resolution.KINDS_OF["postgresql"], {"shas": catalog[0]})
        assert caught.value.connection_invalidated
    with quick_read(settings) as s:  # the pool hands out a live connection next
        assert driver_rows(s.connection(), resolution.KINDS_OF["postgresql"], {"shas": catalog[0]})
