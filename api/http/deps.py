"""FastAPI dependencies: the settings and a catalog session per request."""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, get_type_hints

import anyio
from fastapi import Depends, Request
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session

from enginefarm.core.config import Settings
from storage.db import new_session

# Ending a session (rollback after an error, close) runs on threads of its own, never queued behind routes.
_ENDINGS = anyio.CapacityLimiter(16)


async def settings_dep(request: Request) -> Settings:
    """Async, so that FastAPI calls it on the event loop rather than on a thread of its pool."""
    return request.app.state.settings


async def session_dep(request: Request) -> AsyncIterator[Session]:
    """A catalog session for one request. Routes take it with ``scope="function"``: it commits and gives its
    connection back when the route returns, not after the response is sent (a download would otherwise hold
    a connection for its whole stream). The session connects on its first query, in the route's thread."""
    session = new_session(request.app.state.settings)
    try:
        yield session
    except BaseException:
        await _end_soon(session, commit=False)
        raise
    await _end_soon(session, commit=True)


async def _end_soon(session: Session, commit: bool) -> None:
    with anyio.CancelScope(shield=True):  # a client that hung up must not leave the connection checked out
        await anyio.to_thread.run_sync(_end, session, commit, limiter=_ENDINGS)


def _end(session: Session, commit: bool) -> None:
    try:
        if commit:
            session.commit()
        else:
            session.rollback()
    finally:
        session.close()


# A route's catalog session (committed as the route returns, ``CatalogRoute``) and the settings.
CatalogSession = Annotated[Session, Depends(session_dep, scope="function")]
FarmSettings = Annotated[Settings, Depends(settings_dep)]


class CatalogRoute(APIRoute):
    """A route whose (sync) endpoint commits its catalog session in its own thread as it returns, so the
    connection goes back to the pool before FastAPI serializes the response (which takes another thread of the
    shared pool: under load, routes holding connections then waited on threads held by routes waiting for one)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any):
        super().__init__(path, _committing(endpoint), **kwargs)


def _committing(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    names = [
        name
        for name, hint in get_type_hints(endpoint, include_extras=True).items()
        if any(getattr(d, "dependency", None) is session_dep for d in getattr(hint, "__metadata__", ()))
    ]
    if not names or inspect.iscoroutinefunction(endpoint):
        return endpoint

    @functools.wraps(endpoint)  # FastAPI reads the wrapped signature
    def run(*args: Any, **kwargs: Any) -> Any:
        result = endpoint(*args, **kwargs)
        for name in names:
            kwargs[name].commit()  # the session stays usable: a later query takes a connection again
        return result

    return run
