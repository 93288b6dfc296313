"""The build form: fields pre-filled from a model's inputs, and the spec a submitted form asks for.

Dynamic dims get min/opt/max fields; a trtexec command line is read with the CLI's own parser
(``enginefarm.core.trtexec.spec_from_trtexec``) and wins over the fields. The spec is parsed and validated as POST
/v1/builds does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.schemas import ModelOut
from api.services.builds import spec_from
from enginefarm.core.errors import SpecInvalid
from enginefarm.core.spec import BuildSpec
from enginefarm.core.trtexec import spec_from_trtexec

MAX_FORM_TARGETS = 64


@dataclass
class InputField:
    name: str
    dims: list
    dynamic: bool
    min: str
    opt: str
    max: str


def _fill(dims: list, axis_value: tuple[int, int, int]) -> tuple[str, str, str]:
    out: list[list[str]] = [[], [], []]
    for axis, d in enumerate(dims):
        guess = axis_value if axis == 0 else (1, 64, 256)
        for i in range(3):
            out[i].append(str(d) if isinstance(d, int) and d > 0 else str(guess[i]))
    return "x".join(out[0]), "x".join(out[1]), "x".join(out[2])


def form_fields(model: ModelOut) -> list[InputField]:
    """One entry per model input; a dynamic one comes with suggested min/opt/max shapes (batch 1/4/8)."""
    fields = []
    for spec in model.inputs:
        dims = list(spec.get("dims") or spec.get("shape") or [])
        dynamic = any(not (isinstance(d, int) and d > 0) for d in dims)
        lo, opt, hi = _fill(dims, (1, 4, 8))
        fields.append(InputField(spec["name"], dims, dynamic, lo, opt, hi))
    return fields


def example_shapes(inputs: list[dict]) -> str:
    """The model's inputs at a shape it takes, in trtexec's syntax: its own dims, a dynamic one at the opt
    shape suggested above (batch 4)."""
    return ",".join(f"{i['name']}:{_fill(list(i.get('dims') or []), (1, 4, 8))[1]}" for i in inputs if i.get("name"))


def _dims(text: str, where: str, problems: list[dict]) -> list[int] | None:
    try:
        dims = [int(d) for d in text.lower().replace("×", "x").split("x")]
    except ValueError:  # int() refuses more than 4300 digits too; a value that long is cut in the message
        shown = repr(text) if len(text) <= 60 else repr(text[:40]) + "..."
        problems.append({"loc": ["form", where], "msg": f"{shown}: write dims as 1x3x224x224"})
        return None
    return dims


def spec_from_form(form: Any) -> tuple[list[str], BuildSpec, bool]:
    """(targets, spec, queue_without_worker) from the submitted form; SpecInvalid names every problem."""
    problems: list[dict] = []
    targets = [t for t in form.getlist("targets") if isinstance(t, str) and t]
    targets += [t.strip() for t in str(form.get("other_targets") or "").split(",") if t.strip()]
    targets = list(dict.fromkeys(targets))[:MAX_FORM_TARGETS]
    if not targets:
        problems.append({"loc": ["form", "targets"], "msg": "choose at least one target"})
    precision = str(form.get("precision") or "fp32")
    spec: dict[str, Any] = {"precision": precision}
    profile: dict[str, dict[str, list[int]]] = {}
    for name in form.getlist("dynamic"):
        ranges = {k: _dims(str(form.get(f"{k}:{name}") or ""), f"{k}:{name}", problems) for k in ("min", "opt", "max")}
        if all(ranges.values()):
            profile[name] = ranges  # type: ignore[assignment]
    if profile:
        spec["profiles"] = [profile]
    if form.get("checks") != "on":
        spec.update(benchmark={"enabled": False}, accuracy={"enabled": False})
    trtexec = str(form.get("trtexec") or "").strip()
    if trtexec:
        try:
            given = spec_from_trtexec(trtexec)
            if "shapes" in given or "profiles" in given:  # the command line's shapes replace the fields'
                spec.pop("profiles", None)
            spec.update(given)
        except ValueError as exc:
            problems.append({"loc": ["form", "trtexec"], "msg": str(exc)})
    parsed, spec_problems = spec_from(spec)
    problems += spec_problems
    if problems or parsed is None:
        raise SpecInvalid(f"the build form has {len(problems)} problem(s)", problems=problems)
    return targets, parsed, form.get("queue_without_worker") == "on"
