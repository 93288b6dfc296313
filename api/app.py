"""The FastAPI application: routers, the one error handler, and startup (migrations)."""

from __future__ import annotations

import difflib
import errno
import functools
import gc
import json
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError, PendingRollbackError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from api import ui
from api.http import buildwait
from api.http.answers import not_modified
from api.http.auth import TokenCache, authorize
from api.http.cachecontrol import NoStoreByDefault
from api.http.fastpath import FleetPath
from api.http.upload import UploadSlots
from api.metrics import Observe
from api.routes import builds, engines, health, models, resolve, tokens, workers
from api.schemas.resolve import ResolveQuery
from api.services.answers import Answers
from api.services.resolve import Tables
from api.services.versions import Versions
from enginefarm import __version__
from enginefarm.core.config import Settings, get_settings
from enginefarm.core.errors import CatalogUnavailable, EnginefarmError, StorageFull
from enginefarm.core.hashing import SHA_HEADER
from enginefarm.core.machine import SHORT_NAMES
from storage.changes import changes_for
from storage.db import migrate

log = logging.getLogger(__name__)


# Uploads stream to disk under their own limits (api/http/upload.py): the API's and the dashboard's.
UPLOAD_PATHS = ("/v1/models", "/ui/models/upload")


class BodyTooLarge(HTTPException):
    """A JSON body past its limit. Raised from the request's receive channel, where FastAPI passes on only
    HTTPExceptions (anything else there becomes a 400); the app's handler gives it the farm's error body."""

    def __init__(self, detail: str):
        super().__init__(status_code=413, detail=detail)


class JsonBodyLimit:
    """Bound every non-upload request body: one whose declared length is over the limit is refused before it is
    read, and one sent without a length (chunked) is cut off as soon as it streams past the limit."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] == "GET" or scope["path"].startswith(UPLOAD_PATHS):
            await self.app(scope, receive, send)
            return
        detail = (
            f"the request body is over the {self.limit} bytes {scope['path']} takes (ENGINEFARM_MAX_JSON_BYTES); "
            "send a smaller body"
        )
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limit:
            await JSONResponse({"error": "PayloadTooLarge", "detail": detail}, status_code=413)(scope, receive, send)
            return
        received = 0

        async def bounded_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(detail)
            return message

        await self.app(scope, bounded_receive, send)


def _answer(exc: EnginefarmError) -> JSONResponse:
    """The error's body, status and headers (Retry-After where it has one; WWW-Authenticate on a 401)."""
    headers = {**({"Retry-After": str(exc.retry_after)} if exc.retry_after else {}), **getattr(exc, "headers", {})}
    return JSONResponse(exc.to_dict(), status_code=exc.status_code, headers=headers or None)


GC_YOUNG = 20_000  # allocations between young collections (the interpreter's default: 700)


def resolve_pool(settings: Settings) -> ThreadPoolExecutor:
    """The threads that compute resolve answers (``ENGINEFARM_RESOLVE_THREADS``): made as they are first used."""
    return ThreadPoolExecutor(settings.resolve_threads, thread_name_prefix="resolve")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        settings.ensure_dirs()
        migrate(settings)
        reconciler = None
        if settings.reconcile_seconds > 0:
            from storage.reconcile import Reconciler

            reconciler = Reconciler(settings).start()
        changes = app.state.versions.changes = changes_for(settings.resolved_database_url)
        changes.watch_revocations(app.state.token_cache.forget, app.state.token_cache.forget_all)
        app.state.build_feed = buildwait.Feed(changes)
        # What is alive after start-up lives as long as the process: frozen out of the collector's generations, so
        # a full collection no longer walks it; and rarer young collections (a computed resolve allocates thousands
        # of short-lived objects), same older ones.
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG, 20, 10)
        try:
            yield
        finally:
            changes.stop()
            # its threads end; a fresh pool (threads made when first used) for an app started again
            threads, app.state.resolve_threads = app.state.resolve_threads, resolve_pool(settings)
            threads.shutdown(wait=False, cancel_futures=True)
            if reconciler is not None:
                reconciler.stop()

    app = FastAPIOffline(
        title="enginefarm",
        version=__version__,
        lifespan=lifespan,
        description="Upload ONNX once; get the right TensorRT engine for every GPU.",
        telemetry=None if settings.opentelemetry else {"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.upload_slots = UploadSlots()
    app.state.token_cache = TokenCache(settings.token_cache_seconds)
    app.state.answers = Answers(settings.resolve_cache_entries, settings.resolve_cache_mib << 20)
    if not settings.opentelemetry:  # a traced request gets its span from the app
        # a fleet's 304s, answered by the server's protocol before the app is called (server.serve)
        app.state.not_modified = functools.partial(not_modified, app)
    app.state.versions = Versions(settings.resolve_fresh_seconds, settings.resolve_cache_entries)  # fed at start-up
    app.state.tables = Tables()
    app.state.resolve_threads = resolve_pool(settings)  # api/routes/resolve.py
    for router in (models.router, builds.router, builds.sweeps, engines.router, resolve.router, tokens.router):
        app.include_router(router, dependencies=[Depends(authorize)])
    app.include_router(workers.router)  # /v1/workers checks its token itself
    app.include_router(health.router)  # /healthz, /readyz and /metrics are open
    ui.mount(app)  # the dashboard, /ui: its pages take a session cookie instead of a bearer token
    app.add_middleware(JsonBodyLimit, limit=settings.max_json_bytes)
    app.add_middleware(FleetPath)  # a fleet's resolve GETs skip routing (api/http/fastpath.py)
    app.add_middleware(NoStoreByDefault)  # no shared cache keeps a token's answers (api/http/cachecontrol.py)
    app.add_middleware(Observe)  # outermost of ours: every request's latency, the fleet's included
    if settings.cors_origins:  # off unless the deployment names the browser origins it trusts
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=[SHA_HEADER],
        )

    @app.exception_handler(EnginefarmError)
    async def _farm_error(request: Request, exc: EnginefarmError) -> Response:
        if request.url.path.startswith("/ui/"):  # the dashboard answers with a page, or a sign-in redirect
            return ui.error_response(request, exc)
        return _answer(exc)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(_request: Request, exc: BodyTooLarge) -> JSONResponse:
        return JSONResponse({"error": "PayloadTooLarge", "detail": exc.detail}, status_code=413)

    # A full disk (the spool, a scratch folder, the local blob store) is the farm's trouble, not the request's:
    # a 503 the client retries. The writer has already removed what it wrote. Other OS errors stay 500s.
    @app.exception_handler(OSError)
    async def _disk_full(_request: Request, exc: OSError) -> JSONResponse:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise exc
        log.warning("storage full: %s", exc)
        return _answer(
            StorageFull(
                f"the farm's storage is full ({os.strerror(exc.errno)}); nothing was stored: "
                "retry later, or ask an operator to free space"
            )
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes the input as UTF-8, which a lone surrogate in a JSON string cannot be:
        # escape everything that is not ASCII instead, so a bad request stays a 422.
        body = json.dumps({"detail": jsonable_encoder(_named_unknowns(exc.errors()))}, ensure_ascii=True)
        return Response(body, status_code=422, media_type="application/json")

    # The catalog database went away (restarting, unreachable, its pool exhausted): a 503 the client retries.
    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    @app.exception_handler(DisconnectionError)
    @app.exception_handler(PendingRollbackError)
    @app.exception_handler(PoolTimeout)
    async def _db_down(_request: Request, exc: Exception) -> JSONResponse:
        log.warning("catalog unavailable: %s", exc.__class__.__name__)
        return _answer(CatalogUnavailable("the catalog database is unavailable; retry shortly"))

    return app


def _named_unknowns(errors: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A query parameter a route does not take (a model of ``extra="forbid"``: GET /v1/resolve's), said as such,
    with the nearest one it takes: "trt_version" → "did you mean trt?"."""
    out = []
    for e in errors:
        loc: Sequence[int | str] = e.get("loc") or ()
        if e.get("type") == "extra_forbidden" and len(loc) == 2 and loc[0] == "query":
            name = str(loc[1])
            near = [SHORT_NAMES[name]] if name in SHORT_NAMES else []  # the fingerprint's long name: trt_version
            near = near or difflib.get_close_matches(name, list(ResolveQuery.model_fields), n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]}?" if near else ""
            e = {**e, "msg": f"unknown query parameter {loc[1]!r}: it would be ignored, so it is refused{hint}"}
        out.append(e)
    return out
