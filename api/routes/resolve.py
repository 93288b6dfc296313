"""GET and POST /v1/resolve: the engine that runs on the asking machine, the fallbacks, and why.

GET takes the fingerprint as query parameters (curl-friendly); POST takes it as JSON. Both answer
the same: 200 with the choice, 404 with a reason per engine when nothing fits, or 202 with a build
id when nothing fits and the caller asked for ``build``.

A 200 carries an ETag (``enginefarm.api.answers``): the same question asked again with ``If-None-Match`` gets a
304 until the model's versions, engines or their benchmarks change, and the same question from another machine
of the fleet is answered from the process's cache without judging anything again.
"""

from __future__ import annotations

from collections import Counter

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from sqlalchemy import Row
from sqlalchemy.orm import Session

from enginefarm.api import services
from enginefarm.api.answers import HEADERS, Answers, Known, digest_of, etag_of, matches
from enginefarm.api.auth import authorize, require
from enginefarm.api.deps import CatalogRoute, session_dep, settings_dep
from enginefarm.api.metrics import RESOLVES
from enginefarm.api.routes import UNPROCESSABLE, check_no_nul
from enginefarm.api.schemas import (
    BACKEND_PATTERN,
    PRECISION_PATTERN,
    SPEC_HASH_PATTERN,
    BuildForMachineOut,
    CandidateOut,
    CheckOut,
    EngineOut,
    ResolveOut,
    ResolveRequest,
)
from enginefarm.compat import Match
from enginefarm.choose import Judged, Wanted
from enginefarm.config import Settings
from enginefarm.shapes import shape_request
from enginefarm.machine import CC_PATTERN, JETPACK_PATTERN, PLATFORM_PATTERN, VERSION_PATTERN, Machine
from enginefarm.storage import resolution
from enginefarm.storage.tokens import Principal

router = APIRouter(route_class=CatalogRoute, prefix="/v1", tags=["resolve"], responses=UNPROCESSABLE)

RESPONSES = {
    304: {"description": "the answer has not changed since the one whose ETag If-None-Match names"},
    202: {"model": BuildForMachineOut, "description": "nothing fits; a build for this machine was submitted (build=true)"},
    404: {"description": "no engine fits; `problems` gives the rule and reason for each"},
}


def _candidate(j: Judged, rows: dict[int, Row], owner: dict[str, Row], explain: bool) -> CandidateOut:
    row, v, ev = rows[j.option.id], j.verdict, j.option.evidence
    return CandidateOut(
        engine_id=row.id, target=row.target, model_version=owner[row.model_sha256].version, precision=row.precision,
        spec_hash=row.spec_hash, rank=j.rank, match=v.match.label if v.match is not None else None,
        rule=v.rule.value if v.rule else None, reason=v.reason, unchecked=v.unchecked, accuracy=ev.accuracy,
        latency_ms=ev.latency_ms, latency_on=ev.latency_on, profiles=row.profiles or [],
        checks=[CheckOut(**c.to_dict()) for c in v.checks] if explain else None,
    )


def answer(req: ResolveRequest, request: Request, session: Session, settings: Settings,
           principal: Principal) -> Response:
    project = principal.project
    machine = req.machine
    models = resolution.model_versions(session, req.model, req.version, project)
    digest = digest_of(req)
    tag = etag_of(digest, project, models)
    headers = {"ETag": tag, **HEADERS}
    if matches(request.headers.get("if-none-match"), tag):
        RESOLVES.labels("not_modified").inc()
        return Response(status_code=304, headers=headers)
    answers: Answers = request.app.state.answers
    if (kept := answers.get(tag)) is not None:
        RESOLVES.labels(kept[1]).inc()
        return Response(kept[0], media_type="application/json", headers=headers)
    wanted = Wanted(precision=req.precision, spec_hash=req.spec_hash, accuracy=req.accuracy,
                    max_latency_ms=req.max_latency_ms, backend=req.backend, accept=frozenset(req.accept))
    owner = resolution.owners(models)
    choice, rows = resolution.judge(session, machine, owner, wanted)
    chosen = choice.chosen
    # A GPU machine that asks for a build wants a GPU engine: the CPU artifact does not stop it.
    only_cpu = chosen is not None and chosen.verdict.match is Match.CPU_FALLBACK and machine.compute_capability
    if chosen is None or (req.build and only_cpu):
        error = resolution.no_fit_error(choice, rows, req.model, req.version)
        RESOLVES.labels("build" if req.build else "no_fit").inc()
        if not req.build:
            error.context["build"] = fit = services.what_would_fit(req)
            if fit["command"]:
                error.message += f"; an engine for it would be {' or '.join(fit['targets'])}: {fit['command']}"
            raise error
        fallback = _candidate(chosen, rows, owner, False) if chosen else None
        session.rollback()  # release the read transaction before the build writes
        built = services.build_for_machine(settings, req.model, req.version, machine, spec_hash=req.spec_hash,
                                           precision=req.precision, project=project, token_id=principal.family_id)
        out = BuildForMachineOut(**built, reasons=error.problems, fallback=fallback)
        return JSONResponse(status_code=202, content=out.model_dump(mode="json"))
    explain = req.explain
    ranked = [_candidate(j, rows, owner, explain) for j in choice.ranked]
    rejected = [_candidate(j, rows, owner, explain) for j in choice.rejected] if explain else None
    engine, version, variant_of, verdict = resolution.chosen_engine(session, chosen.option.id, owner)
    out = ResolveOut(
        model=req.model, machine=req.machine,
        engine=EngineOut.of(engine, version, variant_of=variant_of, verdict=verdict), ranked_by=choice.ranked_by,
        match=chosen.verdict.match.label, reason=chosen.verdict.reason, unchecked=chosen.verdict.unchecked,
        accuracy=chosen.option.evidence.accuracy or "unchecked",
        download_url=f"/v1/engines/{chosen.option.id}/content", fallbacks=ranked[1:],
        excluded=dict(Counter(j.verdict.rule.value for j in choice.rejected if j.verdict.rule)),
        rejected=rejected, candidates=ranked + rejected if explain else None,
    )
    body = out.model_dump_json().encode()
    answers.put(tag, body, out.match)
    RESOLVES.labels(out.match).inc()
    if request.method == "GET":
        answers.remember(request.scope["query_string"], project, Known(req.model, req.version, digest))
    return Response(body, media_type="application/json", headers=headers)


@router.get("/resolve", response_model=ResolveOut, responses=RESPONSES)
def resolve_get(
    request: Request,
    model: str = Query(..., min_length=1, max_length=200),
    version: str | None = Query(None, max_length=100, description='a model version, or "latest"'),
    cc: str | None = Query(None, pattern=CC_PATTERN, description="compute capability, e.g. 8.6"),
    gpu: str | None = Query(None, max_length=200, description="GPU model name as NVML reports it"),
    memory_mib: int | None = Query(None, ge=1, le=1 << 24),
    driver: str | None = Query(None, pattern=VERSION_PATTERN), cuda: str | None = Query(None, pattern=VERSION_PATTERN),
    trt: str | None = Query(None, pattern=VERSION_PATTERN, description="TensorRT runtime version"),
    trt_rtx: str | None = Query(None, pattern=VERSION_PATTERN, description="TensorRT-RTX runtime version"),
    lean: bool = False, platform: str | None = Query(None, pattern=PLATFORM_PATTERN),
    ort: str | None = Query(None, pattern=VERSION_PATTERN, description="ONNX Runtime version"),
    ort_cuda: bool = Query(False, description="ONNX Runtime runs here with its CUDA execution provider"),
    os: str | None = Query(None, max_length=200), jetpack: str | None = Query(None, pattern=JETPACK_PATTERN),
    precision: str | None = Query(None, pattern=PRECISION_PATTERN),
    spec_hash: str | None = Query(None, pattern=SPEC_HASH_PATTERN),
    accuracy: str | None = Query(None, pattern=r"^pass$", description="accuracy=pass keeps engines that passed"),
    max_latency_ms: float | None = Query(None, gt=0, le=1e7),
    shapes: str | None = Query(None, max_length=10_000, description="trtexec syntax: images:1x3x640x640"),
    min_shapes: str | None = Query(None, max_length=10_000, description="with max_shapes (and opt_shapes): a range"),
    opt_shapes: str | None = Query(None, max_length=10_000), max_shapes: str | None = Query(None, max_length=10_000),
    precisions: list[str] = Query([], max_length=5, description="the precisions the machine accepts (repeatable)"),
    backend: str | None = Query(None, pattern=BACKEND_PATTERN),
    cpu: str | None = Query(None, max_length=200, description="CPU model name (/proc/cpuinfo): CPU artifacts are "
                                                              "ranked by latency measured on it"),
    accept: list[str] = Query([], max_length=3, description="unchecked, failed and/or cpu (repeatable)"),
    explain: bool = False, build: bool = False,
    session: Session = Depends(session_dep, scope="function"), settings: Settings = Depends(settings_dep),
    principal: Principal = Depends(authorize),
):
    """Resolve with the fingerprint in the query string."""
    check_no_nul("query", model=model, version=version)
    if build:  # queueing the missing build is a write
        require(principal, "build", "resolve with build=true")
    try:
        wanted_shapes = shape_request(shapes, min_shapes, opt_shapes, max_shapes)
    except ValueError as exc:
        raise RequestValidationError([{"type": "value_error", "loc": ("query", "shapes"), "input": shapes,
                                       "msg": f"{exc}; write shapes as trtexec does, e.g. "
                                              "shapes=images:1x3x640x640 or min_shapes=images:1x3x320x320"
                                              "&max_shapes=images:4x3x640x640"}]) from None
    try:
        machine = Machine(gpu_name=gpu, compute_capability=cc, memory_mib=memory_mib, driver_version=driver,
                          cuda_version=cuda, trt_version=trt, trt_rtx_version=trt_rtx, lean_runtime=lean,
                          platform=platform, os=os, jetpack=jetpack, shapes=wanted_shapes, cpu_name=cpu,
                          ort_version=ort, ort_cuda=ort_cuda,
                          precisions=[p for item in precisions for p in item.split(",") if p])
        req = ResolveRequest(model=model, version=version, machine=machine, precision=precision, spec_hash=spec_hash,
                             accuracy=accuracy, max_latency_ms=max_latency_ms, backend=backend,
                             accept=[a for item in accept for a in item.split(",") if a], explain=explain, build=build)
    except ValidationError as exc:  # the query's own fields, named as a query's
        raise RequestValidationError([
            {"type": e["type"], "msg": e["msg"], "input": e.get("input"),
             "loc": ("query", next(str(x) for x in e["loc"] if x != "machine"))} for e in exc.errors()]) from None
    return answer(req, request, session, settings, principal)


@router.post("/resolve", response_model=ResolveOut, responses=RESPONSES)
def resolve_post(req: ResolveRequest, request: Request, session: Session = Depends(session_dep, scope="function"),
                 settings: Settings = Depends(settings_dep), principal: Principal = Depends(authorize)):
    """Resolve with the fingerprint as JSON (what `enginefarm fetch` and the Python client send)."""
    if req.build:  # queueing the missing build is a write
        require(principal, "build", "resolve with build=true")
    return answer(req, request, session, settings, principal)

