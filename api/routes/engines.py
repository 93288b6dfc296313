"""GET /v1/engines, /v1/engines/{id}, the engine's bytes, and its measurements (the fleet posts its own)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from api.http import downloads
from api.http.auth import Authorized, Tenant
from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.http.params import RowId, check_no_nul, page_offset
from api.schemas import EngineOut, EngineQuery, ErrorOut, Page
from api.schemas.fleet import MeasurementOut, MeasurementsOut, ReferenceOut, Source
from api.schemas.int8 import PrecisionStage
from api.services import engines, fleet
from enginefarm.core.fleet import Measurement
from enginefarm.core.hashing import SHA_HEADER
from storage import builtengines

router = APIRouter(route_class=CatalogRoute, prefix="/v1/engines", tags=["engines"])
CONTENT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"application/octet-stream": {}},
        "description": f"the bytes; {SHA_HEADER} and ETag hold their sha256",
    },
    206: {"content": {"application/octet-stream": {}}, "description": "the byte range asked for (Range)"},
    304: {"description": "If-None-Match named these bytes: the client has them"},
    307: {"description": "fetch the bytes from this short-lived URL (an S3 store)"},
    416: {"description": "the Range asked for is past the end"},
}


@router.get("", response_model=Page[EngineOut])
def list_engines(
    tenant: Tenant, query: Annotated[EngineQuery, Query()], session: CatalogSession, settings: FarmSettings
) -> Page[EngineOut]:
    check_no_nul("query", **query.model_dump())
    limit, offset = max(1, min(query.limit, 500)), page_offset(query.offset)
    rows, total = builtengines.list_engines(session, query, limit=limit, offset=offset, project=tenant)
    return Page(items=engines.answers(session, settings, rows), total=total, limit=limit, offset=offset)


@router.get("/{engine_id}", response_model=EngineOut)
def get_engine(engine_id: RowId, tenant: Tenant, session: CatalogSession, settings: FarmSettings) -> EngineOut:
    return engines.engine(session, settings, engine_id, tenant)


@router.get("/{engine_id}/benchmarks")
def engine_benchmarks(engine_id: RowId, tenant: Tenant, session: CatalogSession) -> list[dict]:
    """Every measurement of the engine its project made: per shape and device, all statistics and the machine
    fingerprint."""
    return engines.benchmarks(session, engine_id, tenant)


@router.post(
    "/{engine_id}/measurements",
    status_code=201,
    response_model=MeasurementOut,
    responses={
        422: {"model": ErrorOut, "description": "figures that cannot be, or a machine the engine cannot run on"},
        429: {"model": ErrorOut, "description": "the token posted more than the farm takes a minute"},
    },
)
def post_measurement(
    engine_id: RowId, body: Measurement, principal: Authorized, session: CatalogSession, settings: FarmSettings
) -> MeasurementOut:
    """What a deploy machine measured of an engine of the token's project (``enginefarm measure``; scope
    ``measure``). It counts in the project's ranking for the machine's class (its GPU model, its compute
    capability, or its CPU for the CPU artifact), as the median over machines, beside the farm's own figures."""
    return fleet.post(session, settings, engine_id, principal, body)


@router.get("/{engine_id}/measurements", response_model=MeasurementsOut)
def engine_measurements(
    engine_id: RowId,
    tenant: Tenant,
    session: CatalogSession,
    source: Source | None = Query(None, description="only the farm's workers' figures, or only the fleet's"),
) -> MeasurementsOut:
    """Every figure of the engine its project has: the farm's benchmarks and the fleet's posts side by side, each
    fleet post flagged where it is far off its class, and the fleet's median per device class."""
    return fleet.listing(session, engine_id, tenant, source)


@router.get(
    "/{engine_id}/reference",
    response_model=ReferenceOut,
    responses={404: {"model": ErrorOut, "description": "no reference outputs computed for the engine yet"}},
)
def engine_reference(engine_id: RowId, tenant: Tenant, session: CatalogSession) -> ReferenceOut:
    """What a deploy machine checks the engine's accuracy against (``enginefarm measure``): the inputs of the
    project's check and ONNX Runtime FP32's outputs on them, as one .npz (``content``), with the limits of the
    engine's precision. The farm's own check judges against the same."""
    return fleet.reference_of(session, engine_id, tenant)[0]


@router.get("/{engine_id}/reference/content", response_class=Response, responses=CONTENT_RESPONSES)
def engine_reference_content(
    engine_id: RowId, tenant: Tenant, request: Request, session: CatalogSession, settings: FarmSettings
) -> Response:
    """The reference file's bytes (.npz), with their sha256 for the client to check."""
    _, ref = fleet.reference_of(session, engine_id, tenant)
    return downloads.blob_response(request, settings, ref.blob_key, ref.sha256, f"reference-{engine_id}.npz")


@router.get(
    "/{engine_id}/int8",
    response_model=PrecisionStage,
    responses={404: {"model": ErrorOut, "description": "not an int8 engine the farm quantized"}},
)
def engine_int8_stage(engine_id: RowId, tenant: Tenant, session: CatalogSession) -> PrecisionStage:
    """What the int8 stage did for an int8 engine the farm quantized: the CPU candidates measured, the accuracy
    repair (the ranking by measured sensitivity with ONNX node names, the layers kept in fp32, the cosine before
    and after) and the fp32/int8 latency measured. 404 for an engine the farm did not quantize."""
    lacks = "int8 stage: only int8 engines the farm quantized from calibration samples have one"
    return engines.precision_stage(session, engine_id, tenant, "int8", lacks)


@router.get(
    "/{engine_id}/fp16",
    response_model=PrecisionStage,
    responses={404: {"model": ErrorOut, "description": "not an fp16 engine whose build ran an accuracy repair"}},
)
def engine_fp16_repair(engine_id: RowId, tenant: Tenant, session: CatalogSession) -> PrecisionStage:
    """The fp16 accuracy repair of an fp16 engine whose build asked ``accuracy_repair``, in the int8 stage's shape
    (``precision: fp16``, ``repair`` only): the nodes ranked by the fp16 gate measured on the CPU with each kept in
    fp32 alone (ONNX node names), the nodes kept in fp32, the gate before and after, or the budget stop's note.
    404 for an engine without one."""
    lacks = "fp16 repair: only fp16 engines of a build that asked accuracy_repair have one"
    return engines.precision_stage(session, engine_id, tenant, "fp16", lacks)


@router.get("/{engine_id}/content", response_class=Response, responses=CONTENT_RESPONSES)
def engine_content(
    engine_id: RowId, tenant: Tenant, request: Request, session: CatalogSession, settings: FarmSettings
) -> Response:
    """The engine's bytes, with their sha256 for the client to check (ETag; 304 to If-None-Match; Range; a 307 to
    S3 where the store is S3)."""
    return downloads.engine_content(request, session, settings, engine_id, tenant)
