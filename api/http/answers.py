"""Resolve answers as HTTP: the route's responses, and a fleet's GET answered before routing.

``answer`` turns the resolve service's outcome (``api.services.resolve``) into a response with its ETag; the GET
and POST routes, the fleet's path and the dashboard all answer through it.

A GET whose query string was answered before, from a token in the token cache, is answered from the kept answer
(``api.services.answers``) or with a 304 (``FleetPath``; or by the server's protocol, ``not_modified``) from the
versions' generations alone, which are kept while the catalog's change feed stands still
(``api.services.versions``). Anything else, and anything that goes wrong on the way, takes the full path.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time

import anyio
from fastapi import Request, Response
from sqlalchemy import Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from starlette.datastructures import Headers

from api.http.auth import refresh_soon
from api.metrics import REQUEST_SECONDS, RESOLVES, labelled
from api.schemas.resolve import ResolveRequest
from api.services import resolve as resolver
from api.services.answers import Answers, Known, matches
from enginefarm.core.config import Settings
from storage import resolution
from storage.db import quick_read
from storage.tokens import Principal, hash_token

log = logging.getLogger(__name__)
PATH = "/v1/resolve"
HEADERS = {"Cache-Control": "private, no-cache"}
_CACHE_CONTROL = b"cache-control: private, no-cache\r\n"


def _versions(settings, known: Known, project: str | None) -> list[Row]:
    with quick_read(settings) as session:
        return resolution.model_versions(session, known.model, known.version, project)


async def versions_of(app, known: Known, project: str | None) -> list[Row]:
    """The versions a known question names: kept (``api.services.versions``), else read on a thread, one read per
    question at a time (those that miss while it runs wait for it). A kept entry near the end of its time is read
    again in the background while it still answers."""
    versions = app.state.versions
    key = (known.model, known.version, project)
    models = versions.get(key)
    if models is not None:
        if key not in versions.reading and versions.due(key):
            _start_read(app, known, project, key)
        return models
    reading = versions.reading.get(key) or _start_read(app, known, project, key)
    return await asyncio.shield(reading)


_READS: set[asyncio.Task] = set()  # a task nobody holds may be collected before it ends


def _start_read(app, known: Known, project: str | None, key) -> asyncio.Future:
    versions = app.state.versions
    loop = asyncio.get_running_loop()
    reading = versions.reading[key] = loop.create_future()
    reading.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failure no one waited for is not logged

    async def read() -> None:
        try:
            stamp = versions.stamp()
            models = await anyio.to_thread.run_sync(_versions, app.state.settings, known, project)
            versions.put(key, models, stamp)
            reading.set_result(models)
        except BaseException as exc:  # noqa: BLE001 - the waiters take the full path, which says what is wrong
            reading.set_exception(exc if isinstance(exc, Exception) else RuntimeError("read cancelled"))
        finally:
            del versions.reading[key]

    task = loop.create_task(read())
    _READS.add(task)
    task.add_done_callback(_READS.discard)
    return reading


def reader_of(app, authorization: str | None) -> Principal | None:
    """The principal of an Authorization header's bearer token where the token cache holds it and it may read; None
    where only the full path can tell (no token, an unknown one, one that may not read)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    cache = app.state.token_cache
    key = hash_token(token := token.strip())
    principal = cache.get(key)
    if principal is None or not principal.allows("read"):
        return None
    refresh_soon(cache, app.state.settings, key, token)
    return principal


def not_modified(app, query: bytes, authorization: bytes, if_none_match: bytes) -> bytes | None:
    """A fleet's conditional GET /v1/resolve answered by the server's HTTP protocol before the app is called
    (``server.serve``): the 304's own header lines, counted as the app counts a 304. Only where nothing would be
    read: the token cache holds the token with ``read``, the query string was answered before, its versions are
    kept with no read of them due, and If-None-Match names the current tag. None: the app answers."""
    started = time.perf_counter()
    principal = reader_of(app, authorization.decode("latin-1"))
    if principal is None:
        return None
    known = app.state.answers.known(query, principal.project)
    if known is None:
        return None
    versions = app.state.versions
    key = (known.model, known.version, principal.project)
    models = versions.get(key)
    if models is None or (key not in versions.reading and versions.due(key)):  # the app starts the read
        return None
    tag = app.state.answers.tag_of(known, principal.project, models)
    if not matches(if_none_match.decode("latin-1"), tag):
        return None
    labelled(RESOLVES, "not_modified").inc()
    labelled(REQUEST_SECONDS, "GET", PATH, "304").observe(time.perf_counter() - started)
    return b"etag: " + tag.encode() + b"\r\n" + _CACHE_CONTROL


async def fleet_answer(app, scope, headers: Headers, principal: Principal) -> Response | None:
    """The answer to a GET asked before, from the cache or as a 304; None to take the full path."""
    answers: Answers = app.state.answers
    known = answers.known(scope["query_string"], principal.project)
    if known is None:
        return None
    try:
        models = await versions_of(app, known, principal.project)
    except Exception:  # the full path says what is wrong (a 404, a 503)
        log.debug("fleet path: falling back", exc_info=True)
        return None
    tag = answers.tag_of(known, principal.project, models)
    out = {"ETag": tag, **HEADERS}
    if matches(headers.get("if-none-match"), tag):
        labelled(RESOLVES, "not_modified").inc()
        return Response(status_code=304, headers=out)
    if (kept := answers.get(tag)) is not None:
        labelled(RESOLVES, kept[1]).inc()
        return Response(kept[0], media_type="application/json", headers=out)
    return None


def answer(
    req: ResolveRequest, request: Request, session: Session | None, settings: Settings, principal: Principal
) -> Response:
    """The outcome of ``resolver.resolve`` as a response. Its reads run on an autocommit connection without a ping
    (``quick_read``); a connection that died under it is discarded and the question asked once more on a fresh
    one. The ``session`` is not used (the dashboard passes the one it holds)."""
    state = request.app.state
    fleets = request.method == "GET" and request.scope["path"] == PATH

    def ask(reads: Session) -> resolver.Outcome:
        return resolver.resolve(
            req,
            reads,
            settings,
            principal,
            answers=state.answers,
            versions=state.versions,
            tables=state.tables,
            if_none_match=request.headers.get("if-none-match"),
            # remembered for the fleet's path: a GET of this API's own question (not the dashboard's page, whose
            # query string reads otherwise), never one with build=true (the route checks its scope every time)
            query=request.scope["query_string"] if fleets and not req.build else None,
        )

    try:
        with quick_read(settings) as reads:
            out = ask(reads)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        with quick_read(settings) as reads:
            out = ask(reads)
    if out.status == 202:
        return Response(out.body, status_code=202, media_type="application/json")
    assert out.tag is not None  # every 200 and 304 of the service has its tag
    headers = {"ETag": out.tag, **HEADERS}
    if out.status == 304:
        return Response(status_code=304, headers=headers)
    return Response(out.body, media_type="application/json", headers=headers)


async def answered(req: ResolveRequest, request: Request, settings: Settings, principal: Principal) -> Response:
    """``answer`` on one of the process's resolve threads (``ENGINEFARM_RESOLVE_THREADS``): a computed answer is
    mostly Python holding the GIL, so a few threads serve it better than the server's whole pool."""
    if req.build:  # a build for the machine writes and queues: never in the way of the answers (the server's pool)
        return await anyio.to_thread.run_sync(answer, req, request, None, settings, principal)
    pool, run = request.app.state.resolve_threads, contextvars.copy_context().run  # the request's context goes along
    return await asyncio.get_running_loop().run_in_executor(pool, run, answer, req, request, None, settings, principal)
