"""GET and POST /v1/resolve: the engine that runs on the asking machine, the fallbacks, and why.

GET takes the fingerprint as query parameters (curl-friendly); POST takes it as JSON. Both answer
the same: 200 with the choice, 404 with a reason per engine when nothing fits, or 202 with a build
id when nothing fits and the caller asked for ``build``. The routes parse the question and answer;
``api.resolver.resolve`` decides what.

A 200 carries an ETag (``api.answers``): the same question asked again with ``If-None-Match`` gets a
304 until the model's versions, engines or their benchmarks change, and the same question from another machine
of the fleet is answered from the process's cache without judging anything again.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from api import resolver
from api.answers import HEADERS, PATH
from api.auth import authorize, require
from api.deps import CatalogRoute, settings_dep
from api.routes import UNPROCESSABLE
from api.schemas import BuildForMachineOut, ResolveOut, ResolveQuery, ResolveRequest, request_of
from enginefarm.core.config import Settings
from enginefarm.core.machine import SHORT_NAMES
from storage.db import quick_read
from storage.tokens import Principal

router = APIRouter(route_class=CatalogRoute, prefix="/v1", tags=["resolve"], responses=UNPROCESSABLE)

RESPONSES = {
    304: {"description": "the answer has not changed since the one whose ETag If-None-Match names"},
    202: {
        "model": BuildForMachineOut,
        "description": "nothing fits; a build for this machine was submitted (build=true)",
    },
    404: {"description": "no engine fits; `problems` gives the rule and reason for each"},
}


def answer(
    req: ResolveRequest, request: Request, session: Session | None, settings: Settings, principal: Principal
) -> Response:
    """The outcome of ``resolver.resolve`` as a response. Its reads run on an autocommit connection without a ping
    (``quick_read``: no BEGIN, COMMIT or SELECT 1 around them, three round trips of about eight); a connection
    that died under it (a database restart) is discarded and the question asked once more on a fresh one. The
    ``session`` is not used (the dashboard passes the one it holds)."""
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
    headers = {"ETag": out.tag, **HEADERS}
    if out.status == 304:
        return Response(status_code=304, headers=headers)
    return Response(out.body, media_type="application/json", headers=headers)


async def answered(req: ResolveRequest, request: Request, settings: Settings, principal: Principal) -> Response:
    """``answer`` on one of the process's resolve threads (``ENGINEFARM_RESOLVE_THREADS``, ``app.state``): a
    computed answer is mostly Python holding the GIL, so a few threads answer more a second, each for less CPU, than
    the forty threads of the server's pool taking turns at it. The event loop never waits on the catalog."""
    if req.build:  # a build for the machine writes and queues: never in the way of the answers (the server's pool)
        return await anyio.to_thread.run_sync(answer, req, request, None, settings, principal)
    # The process's own pool of resolve threads, through asyncio's executor hand-off: anyio's (its capacity limiter,
    # its run-time lookups of the event loop's library) was about a tenth of a cold answer's GIL time.
    pool, run = request.app.state.resolve_threads, contextvars.copy_context().run  # the request's context goes along
    return await asyncio.get_running_loop().run_in_executor(pool, run, answer, req, request, None, settings, principal)


@router.get("/resolve", response_model=ResolveOut, responses=RESPONSES)
async def resolve_get(
    request: Request,
    query: Annotated[ResolveQuery, Query()],
    settings: Settings = Depends(settings_dep),
    principal: Principal = Depends(authorize),
):
    """Resolve with the fingerprint in the query string: POST's body flattened, the machine's fields under their
    short names (cc, gpu, trt_rtx), its shapes as trtexec writes them, and repeatable lists that also take commas."""
    if query.build:  # queueing the missing build is a write
        require(principal, "build", "resolve with build=true")
    try:
        req = request_of(query)
    except ValidationError as exc:  # the fingerprint's own rules, named as the query names its fields
        raise RequestValidationError(
            [
                {
                    "type": e["type"],
                    "msg": e["msg"],
                    "input": e.get("input"),
                    "loc": ("query", _query_name(e["loc"])),
                }
                for e in exc.errors()
            ]
        ) from None
    except ValueError as exc:  # shapes trtexec would not read
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("query", "shapes"),
                    "input": query.shapes,
                    "msg": f"{exc}; write shapes as trtexec does, e.g. "
                    "shapes=images:1x3x640x640 or min_shapes=images:1x3x320x320"
                    "&max_shapes=images:4x3x640x640",
                }
            ]
        ) from None
    return await answered(req, request, settings, principal)


def _query_name(loc: tuple[int | str, ...]) -> str:
    """A body error's location as the query parameter that carried it: machine.compute_capability is cc."""
    names = [str(x) for x in loc if x != "machine"]
    return SHORT_NAMES.get(names[0], names[0]) if names else "query"


@router.post("/resolve", response_model=ResolveOut, responses=RESPONSES)
async def resolve_post(
    req: ResolveRequest,
    request: Request,
    settings: Settings = Depends(settings_dep),
    principal: Principal = Depends(authorize),
):
    """Resolve with the fingerprint as JSON (what `enginefarm fetch` and the Python client send)."""
    if req.build:  # queueing the missing build is a write
        require(principal, "build", "resolve with build=true")
    return await answered(req, request, settings, principal)
