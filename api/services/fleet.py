"""The fleet's measurements of an engine: a deploy machine posts what it measured (``enginefarm measure``), and the
engine's figures are listed with the farm's own beside them. The routes (api/routes/engines.py) call these."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

from sqlalchemy.orm import Session

from api.schemas.fleet import FleetClassOut, MeasurementOut, MeasurementsOut, Source
from enginefarm.core.choose import is_cpu_artifact
from enginefarm.core.compat import judge
from enginefarm.core.config import Settings
from enginefarm.core.domain import EngineDescriptor
from enginefarm.core.errors import MeasurementsTooFast, SpecInvalid
from enginefarm.core.fleet import ClassFigure, Measurement, class_figures, describe_class
from storage import builtengines, fleet
from storage.db import as_utc
from storage.tables import BenchmarkRow, DeviceMeasurementRow, EngineRow, utcnow
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
    return _fleet_out(added, added.machine_id in fleet.flagged_machines(session, row.id, model.project))


def _unfit(row: EngineRow, why: str) -> SpecInvalid:
    message = f"engine {row.id} ({row.target}) cannot have run on the machine this measurement names: {why}"
    return SpecInvalid(message, problems=[{"loc": ["body", "machine"], "msg": why}])


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
