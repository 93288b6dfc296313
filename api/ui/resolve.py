""""Which engine runs on my machine?": a form whose answer is /v1/resolve's own, with the explanation table."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from enginefarm.api.routes import resolve as resolve_routes
from enginefarm.api.schemas import ResolveRequest
from enginefarm.api.ui import session as ui_session
from enginefarm.api.ui.render import page
from enginefarm.errors import EnginefarmError, NoCompatibleEngine
from enginefarm.machine import Machine
from enginefarm.probe import GpuInfo, JetsonInfo, MachineProbe, machine_fingerprint
from enginefarm.shapes import shape_request
from enginefarm.storage import catalog
from enginefarm.storage.db import session_scope
from enginefarm.storage.tokens import Principal

router = APIRouter(prefix="/ui")
FIELDS = ("model", "version", "gpu_name", "compute_capability", "memory_mib", "driver_version", "cuda_version",
          "trt_version", "trt_rtx_version", "platform", "jetpack", "shapes", "probe")
CCS = ("7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "12.0", "12.1")
MAX_PROBE_CHARS = 100_000


def machine_from_probe(text: str) -> Machine:
    """The fingerprint in a pasted ``enginefarm worker --probe --json`` (or a ``Machine`` as JSON)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("the probe must be a JSON object")
    if "gpus" not in data:  # a fingerprint as /v1/resolve takes it
        return Machine(**data)
    fields = {k: v for k, v in data.items() if k in MachineProbe.__dataclass_fields__}
    fields["gpus"] = [GpuInfo(**g) for g in data.get("gpus") or []]
    fields["jetson"] = JetsonInfo(**data["jetson"]) if data.get("jetson") else None
    fields.setdefault("modules", {})
    # The lean runtime is read from the probing machine only through the module list it reported.
    return replace(machine_fingerprint(MachineProbe(**fields)), lean_runtime=False)


def machine_from_form(form: dict[str, str]) -> Machine:
    if form.get("probe", "").strip():
        machine = machine_from_probe(form["probe"][:MAX_PROBE_CHARS])
    else:
        memory = form.get("memory_mib", "").strip()
        machine = Machine(**{k: (form.get(k, "").strip() or None) for k in
                             ("gpu_name", "compute_capability", "driver_version", "cuda_version", "trt_version",
                              "trt_rtx_version", "platform", "jetpack")},
                          memory_mib=int(memory) if memory else None)
    if form.get("shapes", "").strip():
        machine = replace(machine, shapes=shape_request(form["shapes"]))
    return machine


def _ask(request: Request, principal: Principal, form: dict[str, str]) -> dict[str, Any]:
    """The answer (or why there is none) and the explanation table, from the resolve route's ``answer``."""
    settings = request.app.state.settings
    try:
        machine = machine_from_form(form)
        req = ResolveRequest(model=form["model"], version=form.get("version") or None, machine=machine, explain=True)
    except (ValidationError, ValueError, TypeError) as exc:
        return {"problem": f"the machine as given is not valid: {exc}"}
    with session_scope(settings) as s:
        try:
            response = resolve_routes.answer(req, request, s, settings, principal)
        except NoCompatibleEngine as exc:
            return {"none": exc.message, "problems": exc.problems}
        except EnginefarmError as exc:  # an unknown model, a name in several projects
            return {"problem": exc.message}
    return {"answer": json.loads(response.body)}


def _model_names(principal: Principal, settings) -> list[str]:
    with session_scope(settings) as s:
        rows, _ = catalog.list_models(s, limit=500, project=principal.project)
        return sorted({r.name for r in rows})


@router.get("/resolve")
async def resolve_form(request: Request, model: str = "",
                       principal: Principal = Depends(ui_session.viewer)) -> Response:
    names = await run_in_threadpool(_model_names, principal, request.app.state.settings)
    return page(request, "resolve.html", form={"model": model}, names=names, ccs=CCS, result=None)


@router.post("/resolve")
async def resolve_answer(request: Request, principal: Principal = Depends(ui_session.viewer)) -> Response:
    await ui_session.check_csrf(request)  # a read, but a form like the others
    raw = await request.form()
    form = {k: str(raw.get(k) or "") for k in FIELDS}
    if not form["model"].strip():
        result: dict[str, Any] = {"problem": "name the model"}
    else:
        result = await run_in_threadpool(_ask, request, principal, form)
    names = await run_in_threadpool(_model_names, principal, request.app.state.settings)
    return page(request, "resolve.html", form=form, names=names, ccs=CCS, result=result)
