"""A build's page (live progress per task) and an engine's page, from the services the API's routes answer with."""

from __future__ import annotations

import shlex

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from api.http import buildwait
from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.http.downloads import engine_content
from api.http.params import RowId
from api.schemas import EngineOut
from api.schemas.builds import BuildOut
from api.services import builds, engines, fleet
from api.ui import session as ui_session
from api.ui.render import page
from enginefarm.core.config import Settings
from storage import builtengines, catalog
from storage.tokens import Principal

router = APIRouter(prefix="/ui", route_class=CatalogRoute)
LIVE = {"queued", "running", "waiting"}


def _build_context(session: Session, settings: Settings, build_id: int, principal: Principal) -> dict:
    """What the build page and its tasks fragment show, with the ``tag`` of the build's answer (the API's ETag of
    ``GET /v1/builds/{id}``): the page's long poll holds it."""
    build: BuildOut = builds.build_of(session, settings, build_id, principal.project)
    model = catalog.get_model(session, build.model_id, principal.project)
    live = any(t.state in LIVE or (t.check or {}).get("in_progress") for t in build.tasks) or build.state in LIVE
    tag = buildwait.tag_of(build.model_dump_json().encode())
    return {"build": build, "model": model, "live": live, "tag": tag}


@router.get("/builds/{build_id}")
def build_page(
    request: Request, build_id: RowId, principal: ui_session.Viewer, session: CatalogSession, settings: FarmSettings
) -> Response:
    return page(request, "build.html", **_build_context(session, settings, build_id, principal))


@router.get("/builds/{build_id}/tasks")
async def build_tasks(
    request: Request,
    build_id: RowId,
    principal: ui_session.Viewer,
    settings: FarmSettings,
    wait: float = buildwait.wait_query(),
    seen: str | None = buildwait.seen_query(),
) -> Response:
    """The page's live part: the build's tasks. The page asks again as soon as each answer arrives, with the tag it
    shows and ``wait``: a long poll on the API's build feed (``api.http.buildwait``), so an open page learns of a change
    within milliseconds and costs no read while nothing moves, where it asked every second before."""
    context = await buildwait.next_context(
        request,
        settings,
        lambda session: _build_context(session, settings, build_id, principal),
        lambda context: context["build"].model_dump_json().encode(),
        seen,
        wait,
    )
    return page(request, "fragments/tasks.html", **context)


def fetch_command(engine: EngineOut, base_url: str) -> str:
    """The ``enginefarm fetch`` line that picks this engine on a machine it runs on."""
    args = [
        "enginefarm",
        "fetch",
        engine.model_name,
        "--version",
        engine.model_version,
        "--spec-hash",
        engine.spec_hash,
        "--precision",
        engine.precision,
        "--platform",
        engine.platform,
    ]
    if engine.compute_capability:
        args += ["--cc", engine.compute_capability]
    if engine.backend == "tensorrt-rtx":
        args += ["--trt-rtx", engine.backend_version]
    elif engine.backend == "tensorrt":
        args += ["--trt", engine.backend_version]
    suffix = "onnx" if engine.backend == "onnxruntime" else "plan"
    args += ["-o", f"{engine.model_name}-{engine.target.replace('/', '-')}.{suffix}", "--api", base_url]
    return shlex.join(args)


# The runtime each backend's engines load in, as its makers name it.
RUNTIMES = {"tensorrt": "TensorRT", "tensorrt-rtx": "TensorRT-RTX", "onnxruntime": "ONNX Runtime"}


def runtime_label(engine: EngineOut) -> str:
    """The runtime the engine was built with and loads in: "TensorRT-RTX 1.7.1.116", "ONNX Runtime 1.23.2"."""
    version = engine.backend_version if engine.backend != "tensorrt" else (engine.trt_version or engine.backend_version)
    return f"{RUNTIMES.get(engine.backend, engine.backend)} {version}"


@router.get("/engines/{engine_id}")
def engine_page(
    request: Request, engine_id: RowId, principal: ui_session.Viewer, session: CatalogSession, settings: FarmSettings
) -> Response:
    engine = engines.engine(session, settings, engine_id, principal.project)
    benchmarks = engines.benchmarks(session, engine_id, principal.project)
    int8 = engines.stage_of(session, *builtengines.engine_in_project(session, engine_id, principal.project))
    measured = fleet.listing(session, engine_id, principal.project, "fleet")
    base = str(request.base_url).rstrip("/")
    return page(
        request,
        "engine.html",
        engine=engine,
        benchmarks=benchmarks,
        fleet=measured,
        fleet_failed=[m for m in measured.items if m.accuracy_pass is False],
        measure=shlex.join(["enginefarm", "measure", "--engine", str(engine.id), "--api", base]),
        fetch=fetch_command(engine, base),
        runtime=runtime_label(engine),
        int8=int8.model_dump(mode="json") if int8 else None,
    )


@router.get("/engines/{engine_id}/content")
def engine_download(
    request: Request, engine_id: RowId, principal: ui_session.Viewer, session: CatalogSession, settings: FarmSettings
) -> Response:
    """The engine's bytes for a signed-in browser: the API's download (sha256 ETag, Range, S3 redirect)."""
    return engine_content(request, session, settings, engine_id, principal.project)
