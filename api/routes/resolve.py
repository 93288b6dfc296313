"""GET /v1/resolve: the engine that runs on the asking machine, and why."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from api.deps import session_dep
from api.schemas import CandidateOut, EngineOut, ResolveOut
from enginefarm.domain import Machine
from storage import catalog

router = APIRouter(prefix="/v1", tags=["resolve"])


def _candidate(c: catalog.Candidate) -> CandidateOut:
    m = c.verdict.match
    return CandidateOut(engine_id=c.engine.id, target=c.engine.target, match=m.label if m is not None else None,
                        reason=c.verdict.reason, unchecked=c.verdict.unchecked)


@router.get("/resolve", response_model=ResolveOut, responses={404: {"description": "no engine fits; the body says why for each"}})
def resolve(
    model: str = Query(..., max_length=200), version: str | None = Query(None, max_length=100),
    cc: str | None = Query(None, pattern=r"^\d{1,2}\.\d$", description="compute capability, e.g. 8.6"),
    gpu: str | None = Query(None, max_length=200, description="GPU model name as NVML reports it"),
    memory_mib: int | None = Query(None, ge=1),
    driver: str | None = Query(None, pattern=r"^\d+(\.\d+){0,3}$"), cuda: str | None = Query(None, pattern=r"^\d+(\.\d+){0,2}$"),
    trt: str | None = Query(None, pattern=r"^\d+(\.\d+){0,3}$", description="TensorRT runtime version"),
    trt_rtx: str | None = Query(None, pattern=r"^\d+(\.\d+){0,3}$", description="TensorRT-RTX runtime version"),
    lean: bool = False, platform: str | None = Query(None, pattern=r"^(x86_64|aarch64)$"),
    jetpack: str | None = Query(None, max_length=20), precision: str | None = Query(None, pattern=r"^(fp32|fp16|bf16|int8|fp8)$"),
    spec_hash: str | None = Query(None, pattern=r"^[0-9a-f]{64}$"),
    session: Session = Depends(session_dep),
) -> ResolveOut:
    machine = Machine(gpu_name=gpu, compute_capability=cc, memory_mib=memory_mib, driver_version=driver,
                      cuda_version=cuda, trt_version=trt, trt_rtx_version=trt_rtx, lean_runtime=lean,
                      platform=platform, jetpack=jetpack)
    res = catalog.resolve(session, machine, model=model, version=version, precision=precision, spec_hash=spec_hash)
    chosen = res.chosen
    return ResolveOut(
        engine=EngineOut.of(chosen.engine), match=chosen.verdict.match.label, reason=chosen.verdict.reason,
        unchecked=chosen.verdict.unchecked, download_url=f"/v1/engines/{chosen.engine.id}/content",
        fallbacks=[_candidate(c) for c in res.fallbacks], rejected=[_candidate(c) for c in res.rejected],
    )
