"""Where each engine's benchmark and accuracy check stand, as a project sees them: one line a user can act on (the
report, a build's tasks, the engine listing, the gate and the dashboard's matrix read these)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from enginefarm.core.config import Settings
from enginefarm.core.domain import TaskState
from enginefarm.core.probe.policy import benchmark_pending_reason
from storage import builtengines, liveness
from storage import checks as project_checks
from storage.checks import ProjectView
from storage.tables import BenchmarkTaskRow, BuildRow, EngineRow


def engine_checks(
    session: Session,
    settings: Settings,
    engines: list[EngineRow],
    view: ProjectView,
    tasks: dict[int, list[BenchmarkTaskRow]] | None = None,
) -> dict[int, dict[str, Any]]:
    """Engine id → the state of the project's benchmark and accuracy check of it, with the pending reason.
    ``tasks``: the checks as read before the engines (``model_report``), else read here."""
    if tasks is None:
        tasks = project_checks.benchmark_tasks_of(session, [e.id for e in engines], view.project)
    served = liveness.served_bench_targets(session, settings.worker_ttl_seconds)
    return {e.id: check_status(e, tasks.get(e.id, []), served, view) for e in engines}


def checks_of_ids(
    session: Session, settings: Settings, ids: list[int], project: str
) -> tuple[dict[int, EngineRow], ProjectView, dict[int, dict[str, Any]]]:
    """The engines of these ids, the project's view of them and ``engine_checks`` of them; the checks are read
    before their evidence (``reports.model_report`` says why)."""
    tasks = project_checks.benchmark_tasks_of(session, ids, project)
    engines = builtengines.engines_by_id(session, ids)
    view = project_checks.project_view(session, list(engines.values()), project)
    return engines, view, engine_checks(session, settings, list(engines.values()), view, tasks)


def build_checks(session: Session, settings: Settings, build: BuildRow) -> dict[int, dict[str, Any]]:
    """Build task id → the check of the engine it made (or reused), with the build's project's accuracy verdict."""
    ids = [t.engine_id for t in build.tasks if t.engine_id]
    engines, view, checks = checks_of_ids(session, settings, ids, build.model.project)
    return {
        t.id: {**checks[t.engine_id], "accuracy_pass": view.accuracy_pass(engines[t.engine_id])}
        for t in build.tasks
        if t.engine_id in checks
    }


def check_status(
    engine: EngineRow, tasks: list[BenchmarkTaskRow], bench_served: set[str], view: ProjectView
) -> dict[str, Any]:
    """Where an engine's benchmark and accuracy check stand, in one line a user can act on."""
    latest = tasks[-1] if tasks else None
    status = _check_status(engine, latest, bench_served, view)
    # A check a live worker will finish (queued where one serves it, or running): worth waiting for.
    status["in_progress"] = latest is not None and (
        latest.state == TaskState.RUNNING.value
        or (latest.state == TaskState.QUEUED.value and latest.target in bench_served)
    )
    if latest is not None:
        status.update(task_id=latest.id, worker_id=latest.worker_id, attempts=latest.attempts)
    return status


def _check_status(
    engine: EngineRow, latest: BenchmarkTaskRow | None, bench_served: set[str], view: ProjectView
) -> dict[str, Any]:
    if latest is None:
        done = bool(view.benchmarks(engine)) or view.verdict(engine) is not None
        return {
            "state": "succeeded" if done else "none",
            "detail": None
            if done
            else "never benchmarked: built before the benchmark stage, or with checks turned "
            "off; build it again with checks on to queue them (the engine is reused)",
        }
    if latest.state == TaskState.QUEUED.value:
        detail = (
            f"{benchmark_pending_reason(latest.parsed_target)}; a machine that has one measures it with "
            f"`enginefarm measure --engine {engine.id}`"
            if latest.target not in bench_served
            else "benchmark queued: a worker that can run it will take it"
        )
        return {"state": "pending", "detail": detail}
    if latest.state == TaskState.RUNNING.value:
        return {"state": "running", "detail": f"benchmark running on {latest.worker_id}"}
    if latest.state == TaskState.FAILED.value:
        return {"state": "failed", "detail": f"benchmark failed: {latest.error}"}
    return {"state": latest.state, "detail": None}
