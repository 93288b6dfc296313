"""The fleet's measurements of an engine: a deploy machine posts what it measured (``enginefarm measure``), and the
engine's figures are listed with the farm's own beside them. The routes (api/routes/engines.py) call these."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from api.schemas.fleet import FleetClassOut, MeasurementOut, MeasurementsOut, ReferenceOut, Source
from enginefarm.core.choose import is_cpu_artifact
from enginefarm.core.compat import judge
from enginefarm.core.config import Settings
from enginefarm.core.domain import EngineDescriptor
from enginefarm.core.errors import MeasurementsTooFast, NotFound, SpecInvalid
from enginefarm.core.fleet import ClassFigure, Measurement, class_figures, describe_class
from enginefarm.measure import accuracy
from storage import builtengines, checks, fleet, references
from storage.db import as_utc
from storage.tables import BenchmarkRow, DeviceMeasurementRow, EngineRow, ReferenceRow, utcnow
from storage.tokens import Principal

WINDOW = timedelta(minutes=1)  # the rate limit's window


def post(session: Session, settings: Settings, engine_id: int, principal: Principal, m: Measurement) -> MeasurementOut:
    """Record what a deploy machine measured of an engine of the token's project: a 422 where the machine could not
    have run it, a 429 past the token's rate. The measurement is the project's the engine is seen through."""
    row, model = builtengines.engine_in_project(session, engine_id, principal.project)
    engine = EngineDescriptor.of(row)
    cpu = is_cpu_artifact(engine)
    machine = m.machine
    if cpu:  # the CPU artifact runs on any machine's CPU: its GPU, if any, is not what was measured
        machine = dataclasses.replace(machine, gpu_name=None, compute_capability=None, ort_cuda=False)
    elif machine.compute_capability is None:
        raise _unfit(row, "the fingerprint has no compute_capability: a GPU engine's figure needs its GPU's")
    verdict = judge(engine, dataclasses.replace(machine, shapes={}))
    if not verdict.runs:
        raise _unfit(row, verdict.reason)
    if principal.family_id is not None:
        since = utcnow() - WINDOW
        posted = fleet.posts_since(session, principal.family_id, since)
        if posted >= settings.measurements_per_minute_per_token:
            raise MeasurementsTooFast(
                f"token '{principal.name}' posted {posted} measurements in the last minute; the farm takes "
                f"{settings.measurements_per_minute_per_token} a minute from one token",
                retry_after=int(WINDOW.total_seconds()),
            )
    judged = _judged(session, row, model.project, m) if m.accuracy else None
    added = fleet.add_measurement(
        session,
        row,
        model.project,
        principal.family_id,
        source="fleet",
        machine_id=m.machine_id,
        gpu_name=machine.gpu_name,
        compute_capability=machine.compute_capability,
        cpu_name=machine.cpu_name,
        machine=dataclasses.asdict(m.machine),
        runtime=m.runtime,
        runtime_version=m.runtime_version,
        shapes=m.shapes,
        median_ms=m.median_ms,
        p99_ms=m.p99_ms,
        throughput_qps=m.throughput_qps,
        stats=m.stats,
        accuracy=m.accuracy.model_dump() if m.accuracy else None,
        accuracy_pass=m.accuracy.passed if m.accuracy else None,
    )
    if judged is not None and judged.accepted:
        _take_verdict(session, row, model.project, judged, added, machine)
    return _fleet_out(added, added.machine_id in fleet.flagged_machines(session, row.id, model.project))


@dataclasses.dataclass
class Judged:
    """A device's accuracy check judged again by the farm, under the gate of the project's check settings."""

    result: dict[str, Any]
    accepted: bool  # the project's gate takes fleet checks as verdicts (``gate.accept_fleet_checks``)


def _judged(session: Session, row: EngineRow, project: str, m: Measurement) -> Judged | None:
    """The device's figures judged by the engine's gate: a 422 where its pass or fail is not what they say. None
    where the project never asked the engine checked (no limits to hold them to): the figures are only kept."""
    assert m.accuracy is not None
    task = checks.latest_check(session, row.id, project)
    if task is None or not task.build_spec.accuracy.enabled:
        return None
    spec = task.build_spec
    limits = spec.accuracy.limits(row.precision)
    outputs = m.accuracy.outputs
    judgement = accuracy.judge(outputs, limits)
    extra: dict[str, Any] = {}
    off = m.accuracy.without_tf32
    if not judgement["pass"] and off is not None and row.precision == "fp32" and accuracy.judge(off, limits)["pass"]:
        # The farm's own rule: an fp32 engine's misses that vanish with TF32 off are TF32's, and it passes.
        tf32 = {
            "explains": True,
            "failures_with_tf32": judgement["failures"],
            "note": "differences beyond the fp32 limits are TF32's: with TF32 off on the same GPU and inputs, "
            "within the limits",
        }
        judgement = {**judgement, "pass": True, "failures": {}}
        extra = {"explained_by": "tf32", "tf32": tf32}
    if judgement["pass"] != m.accuracy.passed:
        said = "passed" if m.accuracy.passed else "failed"
        broken = judgement["failures"].items()
        why = "; ".join(f"{n}: {', '.join(b)}" for n, b in broken) or "every figure is in bounds"
        raise _unfit(
            row,
            f"the accuracy check says it {said}, but its figures under the gate of {row.precision} say "
            f"otherwise ({why})",
            loc="accuracy",
        )
    result: dict[str, Any] = {
        **judgement,
        **extra,
        "inputs": m.accuracy.inputs,
        "precision": row.precision,
        "source": "fleet",
    }
    return Judged(result, spec.gate.accept_fleet_checks)


def _take_verdict(
    session: Session, row: EngineRow, project: str, judged: Judged, added: DeviceMeasurementRow, machine: Any
) -> None:
    """With the project's consent, a device's check is the engine's verdict where the farm has none, and one that
    fails is a failure whatever the farm's said: a fault on a real machine of the fleet is not averaged away."""
    current = checks.verdict_of(session, row.id, project)
    result = {
        **judged.result,
        "fleet": {
            "measurement_id": added.id,
            "machine_id": added.machine_id,
            "gpu_name": machine.gpu_name,
            "cpu_name": machine.cpu_name,
        },
    }
    if not result["pass"]:
        if current is None or current.accuracy_pass is not False:
            checks.record_verdict(session, row.id, project, result)
    elif current is None or (current.accuracy_pass is None):
        checks.record_verdict(session, row.id, project, result)


def _unfit(row: EngineRow, why: str, loc: str = "machine") -> SpecInvalid:
    what = "cannot have run on the machine this measurement names" if loc == "machine" else "was not judged right"
    message = f"engine {row.id} ({row.target}) {what}: {why}"
    return SpecInvalid(message, problems=[{"loc": ["body", loc], "msg": why}])


def listing(session: Session, engine_id: int, project: str | None, source: Source | None) -> MeasurementsOut:
    """Every figure of the engine the project sees, the farm's and the fleet's (or one ``source``), oldest first,
    with the fleet's per device class."""
    row, model = builtengines.engine_in_project(session, engine_id, project)
    posted = fleet.measurements_of(session, row.id, model.project)
    flagged = fleet.flagged_ids(posted)
    items: list[MeasurementOut] = []
    if source in (None, "farm"):
        items += [_farm_out(b) for b in row.benchmarks if b.project == model.project]
    if source in (None, "fleet"):
        items += [_fleet_out(r, r.id in flagged) for r in posted]
    figures = class_figures([fleet.figure_of(r) for r in posted])
    classes = [_class_out(c, f) for c, f in sorted(figures.items())]
    return MeasurementsOut(engine_id=row.id, items=items, fleet=classes)


def by_engine(session: Session, engine_ids: list[int], project: str) -> dict[int, list[FleetClassOut]]:
    """Each engine's fleet figures per device class (the project's), for reports and the dashboard."""
    out: dict[int, list[FleetClassOut]] = {}
    for engine_id, figures in fleet.figures_of(session, engine_ids, project).items():
        out[engine_id] = [_class_out(c, f) for c, f in sorted(class_figures(figures).items())]
    return out


def reference_of(session: Session, engine_id: int, project: str | None) -> tuple[ReferenceOut, ReferenceRow]:
    """The reference outputs the project's check of the engine judges against, with the limits of its precision;
    a 404 that says why where there are none yet."""
    row, model = builtengines.engine_in_project(session, engine_id, project)
    found = references.of_engine(session, row.id, model.project)
    if found is None:
        raise NotFound(
            f"engine {row.id} ({row.target}, {row.precision}) has no reference outputs yet: a worker computes them "
            "when it builds an engine with the accuracy check on; build the model again (the engine is reused, "
            "the reference computed) and ask again"
        )
    task, ref = found
    spec = task.build_spec
    out = ReferenceOut(
        engine_id=row.id,
        precision=row.precision,
        limits=spec.accuracy.limits(row.precision),
        inputs=ref.origin,
        sha256=ref.sha256,
        size=ref.size,
        content=f"/v1/engines/{row.id}/reference/content",
    )
    return out, ref


def _class_out(device_class: str, f: ClassFigure) -> FleetClassOut:
    return FleetClassOut(
        device_class=device_class,
        label=describe_class(device_class, f.machines),
        median_ms=f.median_ms,
        machines=f.machines,
        shapes=json.loads(f.shapes),
        flagged=f.flagged,
    )


def _farm_out(b: BenchmarkRow) -> MeasurementOut:
    return MeasurementOut(
        id=b.id,
        source="farm",
        machine_id=None,
        gpu_name=b.gpu_name,
        compute_capability=b.compute_capability,
        cpu_name=b.cpu_name,
        runtime=None,
        runtime_version=None,
        shape_key=b.shape_key,
        shapes=b.shapes,
        median_ms=b.median_ms,
        p99_ms=b.p99_ms,
        throughput_qps=b.throughput_qps,
        accuracy_pass=None,
        flagged=False,
        created_at=as_utc(b.created_at),
    )


def _fleet_out(r: DeviceMeasurementRow, flagged: bool) -> MeasurementOut:
    return MeasurementOut(
        id=r.id,
        source="fleet",
        machine_id=r.machine_id,
        gpu_name=r.gpu_name,
        compute_capability=r.compute_capability,
        cpu_name=r.cpu_name,
        runtime=r.runtime,
        runtime_version=r.runtime_version,
        shape_key=None,
        shapes=r.shapes,
        median_ms=r.median_ms,
        p99_ms=r.p99_ms,
        throughput_qps=r.throughput_qps,
        accuracy_pass=r.accuracy_pass,
        flagged=flagged,
        created_at=as_utc(r.created_at),
    )
