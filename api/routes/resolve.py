"""GET and POST /v1/resolve: the engine that runs on the asking machine, the fallbacks, and why.

GET takes the fingerprint as query parameters, POST as JSON; both answer the same (``api.http.answers``): 200 with
the choice and an ETag, 304 to If-None-Match while nothing changed, 404 with a reason per engine when nothing fits,
or 202 with a build id when nothing fits and the caller asked for ``build``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from api.http.answers import answered
from api.http.auth import Authorized, require
from api.http.deps import CatalogRoute, FarmSettings
from api.http.params import UNPROCESSABLE, invalid
from api.schemas.resolve import BuildForMachineOut, ResolveOut, ResolveQuery, ResolveRequest, request_of
from enginefarm.core.machine import SHORT_NAMES

router = APIRouter(route_class=CatalogRoute, prefix="/v1", tags=["resolve"], responses=UNPROCESSABLE)

RESPONSES: dict[int | str, dict[str, Any]] = {
    304: {"description": "the answer has not changed since the one whose ETag If-None-Match names"},
    202: {
        "model": BuildForMachineOut,
        "description": "nothing fits; a build for this machine was submitted (build=true)",
    },
    404: {"description": "no engine fits; `problems` gives the rule and reason for each"},
}


@router.get("/resolve", response_model=ResolveOut, responses=RESPONSES)
async def resolve_get(
    request: Request, query: Annotated[ResolveQuery, Query()], settings: FarmSettings, principal: Authorized
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
        raise invalid(
            ("query", "shapes"),
            query.shapes,
            f"{exc}; write shapes as trtexec does, e.g. shapes=images:1x3x640x640 or "
            "min_shapes=images:1x3x320x320&max_shapes=images:4x3x640x640",
        ) from None
    return await answered(req, request, settings, principal)


def _query_name(loc: tuple[int | str, ...]) -> str:
    """A body error's location as the query parameter that carried it: machine.compute_capability is cc."""
    names = [str(x) for x in loc if x != "machine"]
    return SHORT_NAMES.get(names[0], names[0]) if names else "query"


@router.post("/resolve", response_model=ResolveOut, responses=RESPONSES)
async def resolve_post(req: ResolveRequest, request: Request, settings: FarmSettings, principal: Authorized):
    """Resolve with the fingerprint as JSON (what `enginefarm fetch` and the Python client send)."""
    if req.build:  # queueing the missing build is a write
        require(principal, "build", "resolve with build=true")
    return await answered(req, request, settings, principal)
