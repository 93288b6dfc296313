"""POST/GET /v1/models, a model's bytes, samples and report, and its release gate (api/services/gate.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Query, Request, Response

from api.http.auth import Authorized, Tenant
from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.http.downloads import blob_response
from api.http.params import ID_MAX, UNPROCESSABLE, RowId, check_no_nul, page_offset
from api.http.upload import UploadLimits, model_upload, multipart_body, spooled
from api.routes.engines import CONTENT_RESPONSES
from api.schemas import ModelOut, ModelReportOut, Page
from api.schemas.gate import GateOut
from api.services import gate, ingest, reports
from enginefarm.core.errors import NotFound
from storage import catalog
from storage.tables import ModelRow

router = APIRouter(route_class=CatalogRoute, prefix="/v1/models", tags=["models"], responses=UNPROCESSABLE)

UPLOAD_BODY = multipart_body(
    ["file", "name"],
    file={"type": "string", "format": "binary", "description": ".onnx, or .zip/.tar of model.onnx + external data"},
    name={"type": "string"},
    version={"type": "string", "description": "defaults to the next integer under this name"},
    project={
        "type": "string",
        "description": "the project the model belongs to (a project's "
        "token puts it in its own; names and versions are per project)",
    },
)


@router.post(
    "",
    status_code=201,
    response_model=ModelOut,
    openapi_extra=UPLOAD_BODY,
    responses={200: {"description": "identical bytes already uploaded under this name"}},
)
async def upload_model(
    request: Request, response: Response, tenant: Tenant, principal: Authorized, settings: FarmSettings
) -> ModelOut:
    """Upload an ONNX model (streamed to disk, hashed on the way, validated, stored content-addressed)."""
    model, created = await model_upload(request, tenant, principal, settings)
    response.status_code = 201 if created else 200
    return model


@router.get("", response_model=Page[ModelOut])
def list_models(
    tenant: Tenant,
    session: CatalogSession,
    name: str | None = None,
    sha256: str | None = Query(
        None, pattern=r"^[0-9a-f]{64}$", description="only models of these bytes (a client asks before it uploads)"
    ),
    project: str | None = Query(
        None,
        max_length=64,
        description="only this project's models ('' for "
        "those of no project); a project's token sees only its own anyway",
    ),
    limit: int = 50,
    offset: int = 0,
) -> Page[ModelOut]:
    check_no_nul("query", name=name, project=project)
    limit, offset = max(1, min(limit, 500)), page_offset(offset)
    if tenant is not None and project not in (None, tenant):
        return Page(items=[], total=0, limit=limit, offset=offset)
    rows, total = catalog.list_models(
        session, name=name, sha256=sha256, limit=limit, offset=offset, project=tenant if tenant is not None else project
    )
    return Page(items=[ModelOut.of(r) for r in rows], total=total, limit=limit, offset=offset)


@router.get("/{model_id}", response_model=ModelOut)
def get_model(model_id: RowId, tenant: Tenant, session: CatalogSession) -> ModelOut:
    return ModelOut.of(catalog.get_model(session, model_id, tenant))


@router.get("/{model_id}/content", response_class=Response, responses=CONTENT_RESPONSES)
def model_content(
    model_id: RowId, tenant: Tenant, request: Request, session: CatalogSession, settings: FarmSettings
) -> Response:
    """The model's bytes as uploaded (an .onnx file or a bundle), with their sha256."""
    row = catalog.get_model(session, model_id, tenant)
    try:
        return blob_response(request, settings, row.blob_key, row.sha256, f"{row.name}-{row.version}.{row.format}")
    except NotFound:
        raise NotFound(
            f"the bytes of model {row.name} version {row.version} (sha256 {row.sha256}) are missing "
            "from the blob store; upload the same file again under this name to restore them"
        ) from None


SAMPLES_BODY = multipart_body(
    ["file"],
    file={
        "type": "string",
        "format": "binary",
        "description": ".npz with one array per model input; axis 0 stacks samples",
    },
)


@router.post("/{model_id}/samples", response_model=ModelOut, openapi_extra=SAMPLES_BODY)
async def upload_samples(
    model_id: RowId, request: Request, tenant: Tenant, principal: Authorized, settings: FarmSettings
) -> ModelOut:
    """Store sample inputs with the model: int8 calibration and the accuracy check use them instead of
    random data. Checked against the model's inputs (names, ranks, fixed dims, dtypes); no pickles."""
    limits = UploadLimits.of(settings, settings.max_samples_bytes, "ENGINEFARM_MAX_SAMPLES_BYTES")

    def store(path: Path, sha256: str, _fields: dict[str, str]) -> ModelRow:
        return ingest.attach_samples(settings, model_id, path, sha256, tenant)

    return ModelOut.of(await spooled(request, principal, settings, limits, store))


@router.get("/{model_id}/report", response_model=ModelReportOut)
def model_report(model_id: RowId, tenant: Tenant, session: CatalogSession, settings: FarmSettings) -> dict:
    """For every target and shape: latency percentiles (end to end and GPU compute), throughput, accuracy and
    engine size, or why an engine has no numbers yet; with the change against model version N-1; and for each
    int8 engine the farm quantized, its int8 stage: CPU candidates, accuracy repair, fp32/int8 latency."""
    return reports.model_report(session, settings, model_id, tenant)


@router.get("/{model_id}/gate", response_model=GateOut)
def model_gate(
    model_id: RowId,
    tenant: Tenant,
    session: CatalogSession,
    settings: FarmSettings,
    max_regression_pct: float = Query(
        10.0,
        ge=0,
        le=1_000_000,
        allow_inf_nan=False,
        description="the largest slowdown of the median latency against version N-1 "
        "(same target, spec, shape and GPU) that still passes, in percent",
    ),
    pending: Literal["pass", "fail"] = Query(
        "pass",
        description="how a check waiting for hardware the farm lacks counts (a GPU engine on a farm with no such GPU)",
    ),
    targets: list[str] | None = Query(
        None,
        max_length=1000,
        description="gate only these targets (repeat, or comma-separated); default: every target built",
    ),
    build_id: int | None = Query(
        None, ge=1, le=ID_MAX, description="gate this build's tasks; default: per target, the newest build of the model"
    ),
    spec_hash: str | None = Query(None, pattern=r"^[0-9a-f]{64}$", description="only builds of this spec"),
) -> GateOut:
    """Per target and check (build, benchmark, accuracy, latency regression against version N-1): pass, fail or
    pending, with the reason and the numbers; and the verdict over all of them."""
    return gate.evaluate(
        session,
        settings,
        model_id,
        tenant,
        max_regression_pct=max_regression_pct,
        pending=pending,
        targets=gate.parse_targets(targets),
        build_id=build_id,
        spec_hash=spec_hash,
    )
