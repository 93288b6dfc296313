"""The rows of a Core read statement, run straight on the driver's cursor on PostgreSQL: the resolver's hot reads.

SQLAlchemy's execution around a statement (its execution context, the compiled form's cache lookup, the expanding IN
lists rendered per call, the cursor's description turned into result metadata, a processor per column) is a fair
share of a cold resolve's CPU in the API. Here a statement is compiled once per dialect, its IN lists are written
per call as SQLAlchemy writes them (one placeholder per value, so PostgreSQL plans each length as before: binding a
list as one array made the database's share a third larger), and its rows come as psycopg's named tuples, read by
position and by name as a Row is.

Errors come out as SQLAlchemy's (``DBAPIError.instance``), a connection that died is invalidated first, so callers
and the API's handlers treat them as any other. Other databases run the statement as before, and so does a
connection whose statements someone watches (a ``before_cursor_execute`` listener: tracing, a test's count).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable

_EXPANDING = re.compile(r"\(__\[POSTCOMPILE_(\w+)\]\)")
# By the statement's id and the dialect's name; the statement is kept with its compiled form, so that id is never
# another statement's.
_compiled: dict[tuple[int, str], tuple[Executable, str, dict[str, Any]]] = {}


def _compile(statement: Executable, connection: Connection) -> tuple[str, dict[str, Any]]:
    key = (id(statement), connection.dialect.name)
    if (done := _compiled.get(key)) is None:
        compiled = statement.compile(dialect=connection.dialect)  # type: ignore[attr-defined]
        done = _compiled[key] = (statement, str(compiled), dict(compiled.params))
    return done[1], done[2]


def driver_rows(connection: Connection, statement: Executable, params: dict[str, Any]) -> list[Any]:
    """``connection.execute(statement, params).all()``, on PostgreSQL without SQLAlchemy's execution. For
    statements built once and kept (a module's constants): each is compiled once, under its id."""
    if (
        connection.dialect.name != "postgresql"
        or connection.dispatch.before_cursor_execute  # someone watches the statements (tracing, a test): theirs
        or any(isinstance(v, list | tuple) and not v for v in params.values())  # an empty IN: SQLAlchemy writes it
    ):
        return list(connection.execute(statement, params).all())
    sql, defaults = _compile(statement, connection)
    values = {**defaults, **params}
    lists: dict[str, Any] = {}

    def expand(match: re.Match) -> str:  # a list may be named twice (a subquery's IN and the outer one's)
        name = match[1]
        items = lists[name] = values[name]
        return "(" + ", ".join(f"%({name}_{i})s" for i in range(len(items))) + ")"

    sql = _EXPANDING.sub(expand, sql)
    for name, items in lists.items():
        del values[name]
        values.update({f"{name}_{i}": v for i, v in enumerate(items)})
    from psycopg.rows import namedtuple_row  # the server's driver; the client never comes here

    proxied = connection.connection
    try:
        with proxied.driver_connection.cursor(row_factory=namedtuple_row) as cursor:  # type: ignore[union-attr]
            cursor.execute(sql, values)
            return cursor.fetchall()
    except connection.dialect.loaded_dbapi.Error as exc:
        gone = connection.dialect.is_disconnect(exc, proxied, None)
        if gone:
            connection.invalidate(exc)
        raise DBAPIError.instance(
            sql,
            values,
            exc,
            connection.dialect.loaded_dbapi.Error,
            connection_invalidated=gone,
            dialect=connection.dialect,
        ) from exc
