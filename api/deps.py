"""FastAPI dependencies: the settings and a catalog session per request."""

from __future__ import annotations

from typing import Iterator

from fastapi import Request
from sqlalchemy.orm import Session

from enginefarm.config import Settings
from storage.db import session_scope


def settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def session_dep(request: Request) -> Iterator[Session]:
    """A catalog session for one request. Routes take it with ``scope="function"``: it commits and gives its
    connection back when the route returns, not after the response is sent (a download would otherwise hold
    a connection for its whole stream, and a busy API run out of them)."""
    with session_scope(request.app.state.settings) as session:
        yield session
