"""The FastAPI application: routers, the one error handler, and startup (migrations)."""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError, OperationalError

from api.routes import builds, engines, models, resolve, sweeps, workers
from enginefarm import __version__
from enginefarm.config import Settings, get_settings
from enginefarm.errors import EnginefarmError, InfrastructureError
from storage.db import migrate

log = logging.getLogger(__name__)
RETRY_AFTER_S = "5"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        settings.ensure_dirs()
        migrate(settings)
        reconciler = None
        if settings.reconcile_seconds > 0:
            from worker.reconcile import Reconciler

            reconciler = Reconciler(settings).start()
        try:
            yield
        finally:
            if reconciler is not None:
                reconciler.stop()

    app = FastAPI(title="enginefarm", version=__version__, lifespan=lifespan,
                  description="Upload ONNX once; get the right TensorRT engine for every GPU.")
    app.state.settings = settings
    for module in (models, builds, sweeps, engines, resolve, workers):
        app.include_router(module.router)

    @app.exception_handler(EnginefarmError)
    async def _farm_error(_request: Request, exc: EnginefarmError) -> JSONResponse:
        headers = {"Retry-After": RETRY_AFTER_S} if isinstance(exc, InfrastructureError) else None
        return JSONResponse(exc.to_dict(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes the input as UTF-8, which a lone surrogate in a JSON string cannot be:
        # escape everything that is not ASCII instead, so a bad request stays a 422.
        body = json.dumps({"detail": jsonable_encoder(exc.errors())}, ensure_ascii=True)
        return Response(body, status_code=422, media_type="application/json")

    @app.exception_handler(OperationalError)
    @app.exception_handler(DBAPIError)
    async def _db_down(_request: Request, exc: Exception) -> JSONResponse:
        log.warning("catalog unavailable: %s", exc.__class__.__name__)
        return JSONResponse({"error": "CatalogUnavailable", "detail": "the catalog database is unavailable; retry shortly"},
                            status_code=503, headers={"Retry-After": RETRY_AFTER_S})

    return app
