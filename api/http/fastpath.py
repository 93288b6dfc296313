"""GET /v1/resolve before routing: the resolve GETs a fleet sends, answered without FastAPI's routing,
dependencies and parsing of their thirty-odd query parameters.

``FleetPath`` (ASGI middleware) takes a GET /v1/resolve whose bearer token the token cache holds with ``read``:

1. a query string answered before is answered from the kept answer or with a 304 (``api.http.answers.fleet_answer``);
2. any other is parsed here into the route's own query model (``ResolveQuery``) and answered by the route's own
   function on a worker thread.

Anything it cannot answer exactly as the route would goes to the route: a parameter the route does not take, a
value that does not validate, ``build=true``, a token not in the cache, an error no handler of the app's words.
An error on the way is answered by the app's own handler for it (``tests/e2e/api/test_resolve_fastpath.py``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from api.http.answers import PATH, answered, fleet_answer, reader_of
from api.schemas.resolve import LISTS, ResolveQuery, ResolveRequest, request_of

log = logging.getLogger(__name__)
_KNOWN = frozenset(ResolveQuery.model_fields)


def parsed(query_string: bytes) -> ResolveRequest | None:
    """The question a GET's query string asks, read as the route reads it (a repeated parameter that is not a list:
    the last value, as Starlette's query parameters give it); None where the route must answer (it refuses it)."""
    values: dict[str, Any] = {}
    try:
        pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    except ValueError:
        return None
    for name, value in pairs:
        if name not in _KNOWN:
            return None
        if name in LISTS:  # every value, as FastAPI reads a list field
            values.setdefault(name, []).append(value)
        else:
            values[name] = value
    try:
        query: Any = ResolveQuery.model_validate(values)
        if query.build:
            return None
        return request_of(query)
    except (ValidationError, ValueError):
        return None


async def direct_answer(app, scope, principal) -> Response | None:
    """A resolve GET asked for the first time, answered by the route's function without routing; None to take
    the route."""
    req = parsed(scope["query_string"])
    if req is None:
        return None
    request = Request(scope)
    try:
        return await answered(req, request, app.state.settings, principal)
    except Exception as exc:  # a 404 with the reasons, a 503: the app's own handler words it, as for the route
        handler = next((h for cls in type(exc).__mro__ if (h := app.exception_handlers.get(cls))), None)
        if handler is None:
            log.debug("resolve fast path: taking the route", exc_info=True)
            return None
        if asyncio.iscoroutinefunction(handler):
            return await handler(request, exc)
        return await run_in_threadpool(handler, request, exc)


class FleetPath:
    """ASGI middleware: GET /v1/resolve from a cached token is answered by ``fleet_answer`` or ``direct_answer``
    before routing; everything else passes through."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == PATH:
            app = scope["app"]
            headers = Headers(scope=scope)
            principal = reader_of(app, headers.get("authorization"))
            if principal is not None:
                response = await fleet_answer(app, scope, headers, principal)
                if response is None:
                    response = await direct_answer(app, scope, principal)
                if response is not None:
                    scope["metrics_route"] = PATH
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
