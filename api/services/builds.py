"""What the routes call: each function does one request's work across catalog, blobs and broker."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from api.schemas.builds import BuildOut, build_out
from api.services import admission, checkstates
from enginefarm.core.config import Settings
from enginefarm.core.domain import (
    FP16_REPAIR_STAGE,
    ModelInfo,
    Target,
    TaskState,
    gpu_stage_queue,
)
from enginefarm.core.errors import SpecInvalid
from enginefarm.core.spec import BuildSpec, Precision
from enginefarm.core.validation import parse_targets, validate_spec
from enginefarm.graph.inputs import benchmark_shape_problems
from storage import catalog, liveness, queue
from storage.db import session_scope
from storage.tables import BuildRow, ModelRow

log = logging.getLogger(__name__)


def spec_from(payload: dict[str, Any]) -> tuple[BuildSpec | None, list[dict]]:
    """A spec given as plain data (a form, a sweep variant, a stored build), or every problem with its fields."""
    try:
        return BuildSpec.model_validate(payload), []
    except ValidationError as exc:
        return None, [{"loc": ["spec", *err["loc"]], "msg": err["msg"]} for err in exc.errors()]


def _validated(
    settings: Settings,
    s,
    model_id: int,
    target_texts: list[str],
    spec: BuildSpec | None,
    prefix: list | None = None,
    project: str | None = None,
    spec_problems: list[dict] | None = None,
) -> tuple[ModelRow, list[Target], BuildSpec | None, list[dict]]:
    """The model and parsed targets, and every problem with them and the spec (locations under ``prefix``).
    ``spec`` is None when its own fields were invalid (``spec_problems`` says why)."""
    targets, problems = parse_targets(target_texts)
    if len(target_texts) > settings.max_targets_per_build:
        problems.append({"loc": ["targets"], "msg": f"at most {settings.max_targets_per_build} targets per build"})
    problems += spec_problems or []
    model = catalog.get_model(s, model_id, project)
    if spec is not None:
        info = ModelInfo.from_dict(model.info)
        problems += validate_spec(spec, info, targets, has_samples=bool(model.samples_key))
        problems += benchmark_shape_problems(spec, info)
    if prefix:
        problems = [{**p, "loc": [*prefix, *p.get("loc", [])]} for p in problems]
    return model, targets, spec, problems


def _create_build(
    s, model: ModelRow, targets: list[Target], spec: BuildSpec, served: dict[str, set[str]], **extra: Any
) -> tuple[BuildRow, list[queue.Message]]:
    """Record one validated build; returns it and what to publish once committed."""
    quantize = spec.precision is Precision.INT8 and not model.info.get("has_qdq", False)
    fp16_repair = spec.precision is Precision.FP16 and spec.accuracy_repair
    build, checks = catalog.add_build(s, model, spec, targets, served, waiting=quantize or fp16_repair, **extra)
    if quantize:
        build.quantize = {
            "state": TaskState.QUEUED.value,
            "source_model_id": model.id,
            "samples_sha256": model.samples_sha256,
            "detail": "making an int8 Q/DQ model from the samples with ONNX Runtime",
        }
    elif fp16_repair:  # the same waiting stage: worker/fp16/stage.py, on a GPU worker's queue where it judges there
        gpu = next((t for t in sorted(targets, key=str) if t.is_ort_cuda and str(t) in served), None)
        build.quantize = {
            "state": TaskState.QUEUED.value,
            "kind": FP16_REPAIR_STAGE,
            "source_model_id": model.id,
            "samples_sha256": model.samples_sha256,
            "detail": "finding the nodes to keep in fp32 so that fp16 passes its accuracy gate "
            + (f"(ONNX Runtime CUDA, on a worker serving {gpu})" if gpu else "(ONNX Runtime, CPU)"),
            **({"queue": gpu_stage_queue(gpu)} if gpu else {}),
        }
        quantize = True
    out = [queue.Message.build(t.id, t.parsed_target) for t in build.tasks if t.state == TaskState.QUEUED.value]
    out += [queue.Message.bench(c.id, c.parsed_target) for c in checks]
    out += [queue.Message.quantize(build.id, build.quantize)] if quantize else []
    return build, out


def submit_build(
    settings: Settings,
    model_id: int,
    target_texts: list[str],
    spec: BuildSpec,
    project: str | None = None,
    *,
    token_id: int | None = None,
    queue_without_worker: bool | None = None,
    describe: Callable[[BuildRow, dict[str, set[str]]], Any] | None = None,
) -> Any:
    """Validate the spec against the model and every target, record the build, queue its tasks; returns the
    build's id, or what ``describe(build, served)`` makes of it before the commit (so the answer needs no read
    after it, which a database failing in between would turn into a 503 for a build that exists).

    Raises SpecInvalid listing every problem at once, and what ``admission.admit`` raises, with nothing recorded.
    Tasks are published only after the commit. An int8 build of a model without Q/DQ nodes (or an fp16 build with
    ``accuracy_repair``) first queues its stage; its tasks wait for it.
    """
    with session_scope(settings) as s:
        model, targets, _, problems = _validated(settings, s, model_id, target_texts, spec, project=project)
        if problems:
            raise SpecInvalid(f"the build request has {len(problems)} problem(s)", problems=problems)
        served = liveness.served_targets(s, settings.worker_ttl_seconds)
        catalog.hold_admission(s)
        build, publish = _create_build(s, model, targets, spec, served, token_id=token_id)
        admission.admit(settings, s, [build], served, token_id=token_id, queue_without_worker=queue_without_worker)
        s.flush()
        result = describe(build, served) if describe else build.id
    queue.publish(publish)
    return result


# --------------------------------------------------------------------------- sweeps

SWEEP_AXES = ("precision", "optimization_level", "profiles", "hardware_compatibility", "strongly_typed")
MAX_SWEEP_VARIANTS = 64


def _variant_label(overrides: dict[str, Any], axes: dict[str, list]) -> str:
    parts = []
    for key, value in overrides.items():
        if key == "precision":
            parts.append(str(value))
        elif key == "optimization_level":
            parts.append(f"opt{value}")
        elif key == "profiles":
            parts.append(f"profile{axes['profiles'].index(value) + 1}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def submit_sweep(
    settings: Settings,
    model_id: int,
    target_texts: list[str],
    base: BuildSpec,
    axes: dict[str, list],
    project: str | None = None,
    *,
    token_id: int | None = None,
    queue_without_worker: bool | None = None,
) -> int:
    """One build per combination of the axes' values, all validated before any is recorded and admitted as one
    submission; returns the sweep id."""
    problems = [
        {"loc": ["axes", k], "msg": f"cannot sweep {k!r}; sweepable: {', '.join(SWEEP_AXES)}"}
        for k in axes
        if k not in SWEEP_AXES
    ]
    problems += [
        {"loc": ["axes", k], "msg": f"give {k!r} a non-empty list of values"}
        for k, v in axes.items()
        if not isinstance(v, list) or not v
    ]
    if not axes:
        problems.append({"loc": ["axes"], "msg": 'name at least one axis, e.g. {"precision": ["fp32", "fp16"]}'})
    if problems:
        raise SpecInvalid("the sweep request is invalid", problems=problems)
    # Counted before any is made: five long axes multiply to more combinations than memory holds.
    count = math.prod(len(v) for v in axes.values())
    if count > MAX_SWEEP_VARIANTS:
        raise SpecInvalid(
            f"the sweep has {count} variants; at most {MAX_SWEEP_VARIANTS}",
            problems=[{"loc": ["axes"], "msg": f"{count} combinations, at most {MAX_SWEEP_VARIANTS}"}],
        )
    combos = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    given = base.model_dump(mode="json", exclude_unset=True)  # each variant is the base as given, overridden
    publish: list[queue.Message] = []
    with session_scope(settings) as s:
        checked = []
        for overrides in combos:
            label = _variant_label(overrides, axes)
            spec, spec_problems = spec_from({**given, **overrides})
            checked.append(
                (
                    label,
                    _validated(
                        settings,
                        s,
                        model_id,
                        target_texts,
                        spec,
                        prefix=[f"variant {label}"],
                        project=project,
                        spec_problems=spec_problems,
                    ),
                )
            )
        problems = [p for _, (*_, found) in checked for p in found]
        if problems:
            raise SpecInvalid(f"the sweep has {len(problems)} problem(s)", problems=problems)
        # A spec is None only where its fields had problems: with none, every variant has its spec.
        specs = [(label, spec) for label, (_, _, spec, _) in checked if spec is not None]
        hashes = {spec.spec_hash() for _, spec in specs}
        if len(hashes) < len(checked):
            raise SpecInvalid(
                "two variants of the sweep are the same spec",
                problems=[{"loc": ["axes"], "msg": "the axes repeat a value"}],
            )
        model, targets = checked[0][1][0], checked[0][1][1]
        served = liveness.served_targets(s, settings.worker_ttl_seconds)
        catalog.hold_admission(s)
        sweep = catalog.add_sweep(s, model, axes, [str(t) for t in targets])
        builds = []
        for label, spec in specs:
            build, items = _create_build(
                s, model, targets, spec, served, sweep_id=sweep.id, variant=label, token_id=token_id
            )
            builds.append(build)
            publish += items
        admission.admit(settings, s, builds, served, token_id=token_id, queue_without_worker=queue_without_worker)
        sweep_id = sweep.id
    queue.publish(publish)
    return sweep_id


def wait_reason(target: str, state: str, served: dict[str, set[str]], stage: dict | None = None) -> str | None:
    """Why a queued task is not running yet, when the answer is that nobody can take it (``stage``: the build's
    waiting stage, ``BuildRow.quantize``)."""
    if state == TaskState.WAITING.value and (stage or {}).get("kind") == FP16_REPAIR_STAGE:
        return "waiting for the fp16 accuracy repair stage to find the nodes to keep in fp32"
    if state == TaskState.WAITING.value:
        return "waiting for the int8 quantization stage to make the Q/DQ model"
    if state == TaskState.QUEUED.value and target not in served:
        return f"waiting: no live worker serves {target}"
    return None


def task_wait_reason(task, served: dict[str, set[str]]) -> str | None:
    """``wait_reason`` of a task row; its build's stage is read only for a task that waits on it."""
    stage = task.build.quantize if task.state == TaskState.WAITING.value else None
    return wait_reason(task.target, task.state, served, stage)


def answer_of(session: Session, settings: Settings, row: BuildRow) -> BuildOut:
    """A build as its answer shows it: each task's wait reason and each engine's checks."""
    served = liveness.served_targets(session, settings.worker_ttl_seconds)
    return build_out(
        row,
        {t.id: wait_reason(t.target, t.state, served, row.quantize) for t in row.tasks},
        checkstates.build_checks(session, settings, row),
    )


def build_of(session: Session, settings: Settings, build_id: int, project: str | None) -> BuildOut:
    """A build of the project as ``GET /v1/builds/{id}`` and the dashboard's build page show it."""
    return answer_of(session, settings, catalog.get_build(session, build_id, project))
