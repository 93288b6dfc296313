""" "Which engine runs on my machine?": a form whose answer is /v1/resolve's own, with the explanation table.

The page's URL takes the form's fields, and GET /v1/resolve's names for them (``cc``, ``gpu``, ``trt_rtx``, ...), as
its query: ``/ui/resolve?model=yolo&cc=8.6`` opens with the form filled and the answer shown, so an answer can be
linked. A machine the form cannot take (a malformed probe, text the catalog cannot store) is a 422 page that says
what is wrong; an unknown model is a 404 page.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from fastapi import APIRouter, Request, Response
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool

from api.http import answers as resolve_answers
from api.schemas.resolve import ResolveRequest
from api.ui import session as ui_session
from api.ui.buildform import example_shapes
from api.ui.render import page
from enginefarm.core.errors import EnginefarmError, NoCompatibleEngine
from enginefarm.core.machine import SHORT_NAMES, Machine
from enginefarm.core.probe.machineprobe import MachineProbe, machine_fingerprint
from enginefarm.core.shapes import shape_request
from enginefarm.core.text import text_problem
from storage import catalog
from storage.db import session_scope
from storage.tokens import Principal

router = APIRouter(prefix="/ui")
MACHINE_TEXTS = (  # the fingerprint's text fields, as the form names them
    "gpu_name",
    "compute_capability",
    "driver_version",
    "cuda_version",
    "trt_version",
    "trt_rtx_version",
    "platform",
    "jetpack",
)
FIELDS = ("model", "version", *MACHINE_TEXTS, "memory_mib", "shapes", "probe", "accept")
# GET /v1/resolve's query names for the form's fields.
QUERY_NAMES = {short: name for name, short in SHORT_NAMES.items()}  # GET /v1/resolve's names
CCS = ("7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "12.0", "12.1")
MAX_PROBE_CHARS = 100_000
# A probe is a flat object with two levels under it (gpus → a GPU → its fields); anything deeper is not one.
MAX_PROBE_DEPTH = 8
PROBE = TypeAdapter(MachineProbe)


class ProbeInvalid(ValueError):
    """A pasted probe that is not what ``enginefarm worker --probe --json`` prints."""


def _check_probe_values(data: Any) -> None:
    """Refuse a probe nested deeper than any probe is, or holding text the catalog cannot store (named by path)."""
    stack: list[tuple[Any, str, int]] = [(data, "probe", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_PROBE_DEPTH:
            raise ProbeInvalid(
                f"the probe is nested more than {MAX_PROBE_DEPTH} levels deep at {path}: "
                "paste what `enginefarm worker --probe --json` prints"
            )
        if isinstance(value, str) and (problem := text_problem(value)):
            raise ProbeInvalid(f"{path}: {problem}")
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            if isinstance(key, str) and (problem := text_problem(key)):
                raise ProbeInvalid(f"a key of {path}: {problem}")
            stack.append((item, f"{path}[{key!r}]" if isinstance(key, str) else f"{path}[{key}]", depth + 1))


def machine_from_probe(text: str) -> Machine:
    """The fingerprint in a pasted ``enginefarm worker --probe --json`` (or a ``Machine`` as JSON). Raises
    ProbeInvalid, or pydantic's ValidationError naming the field, for anything else."""
    try:
        data = json.loads(text)
    except RecursionError:  # json's parser recurses per level: thousands of brackets exhaust the stack
        raise ProbeInvalid(
            f"the probe is nested more than {MAX_PROBE_DEPTH} levels deep: paste what "
            "`enginefarm worker --probe --json` prints"
        ) from None
    except ValueError as exc:
        raise ProbeInvalid(f"the probe is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProbeInvalid(f"the probe must be a JSON object, not {type(data).__name__}")
    _check_probe_values(data)
    if "gpus" not in data:  # a fingerprint as /v1/resolve takes it
        return Machine(**{str(k): v for k, v in data.items()})
    fields = {k: v for k, v in data.items() if k in MachineProbe.__dataclass_fields__}
    fields.setdefault("modules", {})
    # Typed as the probe writes it: `modules` an object of versions, `gpus` a list of GPU objects, and so on.
    probe = PROBE.validate_python(fields)
    # The lean runtime is read from the probing machine only through the module list it reported.
    return replace(machine_fingerprint(probe), lean_runtime=False)


def machine_from_form(form: dict[str, str]) -> Machine:
    if form.get("probe", "").strip():
        machine = machine_from_probe(form["probe"][:MAX_PROBE_CHARS])
    else:
        memory = form.get("memory_mib", "").strip()
        texts: dict[str, Any] = {k: (form.get(k, "").strip() or None) for k in MACHINE_TEXTS}
        machine = Machine(**texts, memory_mib=int(memory) if memory else None)
    if form.get("shapes", "").strip():
        machine = replace(machine, shapes=shape_request(form["shapes"]))
    return machine


def _ask(request: Request, principal: Principal, form: dict[str, str]) -> dict[str, Any]:
    """The answer (or why there is none) and the explanation table, from the resolve route's ``answer``; with the
    page's status under ``status``."""
    settings = request.app.state.settings
    try:
        machine = machine_from_form(form)
        # "cpu": a machine that names its GPU runtime is handed the ONNX Runtime CPU artifact only when it asks.
        accept = ["cpu"] if form.get("accept", "").strip() == "cpu" else []
        req = ResolveRequest(
            model=form["model"], version=form.get("version") or None, machine=machine, explain=True, accept=accept
        )
    except (ValidationError, ValueError, TypeError) as exc:
        return {"problem": f"the machine as given is not valid: {exc}", "status": 422}
    with session_scope(settings) as s:
        try:
            response = resolve_answers.answer(req, request, s, settings, principal)
        except NoCompatibleEngine as exc:
            return {"none": exc.message, "problems": exc.problems, "status": 200}
        except EnginefarmError as exc:  # an unknown model, a name in several projects
            return {"problem": exc.message, "status": exc.status_code}
    # The answer's Response is made from bytes, so its body is bytes.
    return {"answer": json.loads(cast("bytes", response.body)), "status": 200}


def _model_names(principal: Principal, settings) -> dict[str, str]:
    """The models the form offers, each with its newest version's inputs at a shape they take (the shapes
    field's placeholder)."""
    with session_scope(settings) as s:
        rows, _ = catalog.list_models(s, limit=500, project=principal.project)
        newest = {r.name: r for r in sorted(rows, key=lambda r: r.id)}
        return {name: example_shapes(newest[name].info.get("inputs") or []) for name in sorted(newest)}


def form_from_query(query: Mapping[str, str]) -> dict[str, str]:
    """The form's fields from the page's query string, in the form's names or GET /v1/resolve's."""
    form = {k: "" for k in FIELDS}
    for key, value in query.items():
        field = QUERY_NAMES.get(key, key)
        if field in form and not form[field]:
            form[field] = value
    return form


async def _page(request: Request, principal: Principal, form: dict[str, str], asked: bool) -> Response:
    result: dict[str, Any] | None = None
    if asked and not form["model"].strip():
        result = {"problem": "name the model", "status": 422}
    elif asked:
        result = await run_in_threadpool(_ask, request, principal, form)
    names = await run_in_threadpool(_model_names, principal, request.app.state.settings)
    return page(
        request,
        "resolve.html",
        status_code=result["status"] if result else 200,
        form=form,
        names=names,
        ccs=CCS,
        result=result,
    )


@router.get("/resolve")
async def resolve_form(request: Request, principal: ui_session.Viewer) -> Response:
    """The form; with a model in the query, filled from it and answered (a link to an answer)."""
    form = form_from_query(request.query_params)
    return await _page(request, principal, form, asked=bool(form["model"].strip()))


@router.post("/resolve")
async def resolve_answer(request: Request, principal: ui_session.Viewer) -> Response:
    await ui_session.check_csrf(request)  # a read, but a form like the others
    raw = await request.form()
    return await _page(request, principal, {k: str(raw.get(k) or "") for k in FIELDS}, asked=True)
