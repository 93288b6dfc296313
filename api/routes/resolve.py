"""GET and POST /v1/resolve: the engine that runs on the asking machine, the fallbacks, and why.

GET takes the fingerprint as query parameters (curl-friendly); POST takes it as JSON. Both answer
the same: 200 with the choice, 404 with a reason per engine when nothing fits, or 202 with a build
id when nothing fits and the caller asked for ``build``. The routes parse the question and answer;
``enginefarm.api.resolver.resolve`` decides what.

A 200 carries an ETag (``enginefarm.api.answers``): the same question asked again with ``If-None-Match`` gets a
304 until the model's versions, engines or their benchmarks change, and the same question from another machine
of the fleet is answered from the process's cache without judging anything again.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from enginefarm.api import resolver
from enginefarm.api.answers import HEADERS
from enginefarm.api.auth import authorize, require
from enginefarm.api.deps import CatalogRoute, settings_dep
from enginefarm.api.routes import UNPROCESSABLE, check_no_nul
from enginefarm.api.schemas import (
    BACKEND_PATTERN,
    PRECISION_PATTERN,
    SPEC_HASH_PATTERN,
    BuildForMachineOut,
    ResolveOut,
    ResolveRequest,
)
from enginefarm.core.config import Settings
from enginefarm.core.machine import CC_PATTERN, JETPACK_PATTERN, PLATFORM_PATTERN, VERSION_PATTERN, Machine
from enginefarm.core.shapes import shape_request
from enginefarm.storage.db import quick_read
from enginefarm.storage.tokens import Principal

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
            query=request.scope["query_string"] if request.method == "GET" else None,
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


@router.get("/resolve", response_model=ResolveOut, responses=RESPONSES)
def resolve_get(
    request: Request,
    model: str = Query(..., min_length=1, max_length=200),
    version: str | None = Query(None, max_length=100, description='a model version, or "latest"'),
    cc: str | None = Query(None, pattern=CC_PATTERN, description="compute capability, e.g. 8.6"),
    gpu: str | None = Query(None, max_length=200, description="GPU model name as NVML reports it"),
    memory_mib: int | None = Query(None, ge=1, le=1 << 24),
    driver: str | None = Query(None, pattern=VERSION_PATTERN),
    cuda: str | None = Query(None, pattern=VERSION_PATTERN),
    trt: str | None = Query(None, pattern=VERSION_PATTERN, description="TensorRT runtime version"),
    trt_rtx: str | None = Query(None, pattern=VERSION_PATTERN, description="TensorRT-RTX runtime version"),
    lean: bool = False,
    platform: str | None = Query(None, pattern=PLATFORM_PATTERN),
    ort: str | None = Query(None, pattern=VERSION_PATTERN, description="ONNX Runtime version"),
    ort_cuda: bool = Query(False, description="ONNX Runtime runs here with its CUDA execution provider"),
    os: str | None = Query(None, max_length=200),
    jetpack: str | None = Query(None, pattern=JETPACK_PATTERN),
    precision: str | None = Query(None, pattern=PRECISION_PATTERN),
    spec_hash: str | None = Query(None, pattern=SPEC_HASH_PATTERN),
    accuracy: str | None = Query(None, pattern=r"^pass$", description="accuracy=pass keeps engines that passed"),
    max_latency_ms: float | None = Query(None, gt=0, le=1e7),
    shapes: str | None = Query(None, max_length=10_000, description="trtexec syntax: images:1x3x640x640"),
    min_shapes: str | None = Query(None, max_length=10_000, description="with max_shapes (and opt_shapes): a range"),
    opt_shapes: str | None = Query(None, max_length=10_000),
    max_shapes: str | None = Query(None, max_length=10_000),
    precisions: list[str] = Query([], max_length=5, description="the precisions the machine accepts (repeatable)"),
    backend: str | None = Query(None, pattern=BACKEND_PATTERN),
    cpu: str | None = Query(
        None,
        max_length=200,
        description="CPU model name (/proc/cpuinfo): CPU artifacts are ranked by latency measured on it",
    ),
    accept: list[str] = Query([], max_length=3, description="unchecked, failed and/or cpu (repeatable)"),
    explain: bool = False,
    build: bool = False,
    settings: Settings = Depends(settings_dep),
    principal: Principal = Depends(authorize),
):
    """Resolve with the fingerprint in the query string."""
    check_no_nul("query", model=model, version=version)
    if build:  # queueing the missing build is a write
        require(principal, "build", "resolve with build=true")
    try:
        wanted_shapes = shape_request(shapes, min_shapes, opt_shapes, max_shapes)
    except ValueError as exc:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("query", "shapes"),
                    "input": shapes,
                    "msg": f"{exc}; write shapes as trtexec does, e.g. "
                    "shapes=images:1x3x640x640 or min_shapes=images:1x3x320x320"
                    "&max_shapes=images:4x3x640x640",
                }
            ]
        ) from None
    try:
        machine = Machine(
            gpu_name=gpu,
            compute_capability=cc,
            memory_mib=memory_mib,
            driver_version=driver,
            cuda_version=cuda,
            trt_version=trt,
            trt_rtx_version=trt_rtx,
            lean_runtime=lean,
            platform=platform,
            os=os,
            jetpack=jetpack,
            shapes=wanted_shapes,
            cpu_name=cpu,
            ort_version=ort,
            ort_cuda=ort_cuda,
            precisions=[p for item in precisions for p in item.split(",") if p],
        )
        req = ResolveRequest(
            model=model,
            version=version,
            machine=machine,
            precision=precision,
            spec_hash=spec_hash,
            accuracy=accuracy,
            max_latency_ms=max_latency_ms,
            backend=backend,
            accept=[a for item in accept for a in item.split(",") if a],
            explain=explain,
            build=build,
        )
    except ValidationError as exc:  # the query's own fields, named as a query's
        raise RequestValidationError(
            [
                {
                    "type": e["type"],
                    "msg": e["msg"],
                    "input": e.get("input"),
                    "loc": ("query", next(str(x) for x in e["loc"] if x != "machine")),
                }
                for e in exc.errors()
            ]
        ) from None
    return answer(req, request, None, settings, principal)


@router.post("/resolve", response_model=ResolveOut, responses=RESPONSES)
def resolve_post(
    req: ResolveRequest,
    request: Request,
    settings: Settings = Depends(settings_dep),
    principal: Principal = Depends(authorize),
):
    """Resolve with the fingerprint as JSON (what `enginefarm fetch` and the Python client send)."""
    if req.build:  # queueing the missing build is a write
        require(principal, "build", "resolve with build=true")
    return answer(req, request, None, settings, principal)
