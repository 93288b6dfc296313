"""The release gate of a model version: per target, whether it built, its benchmark ran, its accuracy check
passed and its latency stayed within a limit of version N-1's on the same target, spec, shape and GPU.

A check is ``pass``, ``fail`` or ``pending``. A pending check is either under way (a live worker will finish
it: ask again) or waits for hardware the farm lacks; the caller says whether the latter passes or fails."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session

from api.schemas.gate import CHECKS, CheckName, GateCheck, GateModel, GateOut, GateTarget, Verdict
from api.services import builds as services
from api.services import checkstates, reports
from enginefarm.core.config import Settings
from enginefarm.core.domain import Target, TaskState
from storage import catalog, liveness
from storage.checks import ProjectView
from storage.tables import BuildTaskRow, EngineRow, ModelRow


def _ident(model: ModelRow | None) -> GateModel | None:
    return None if model is None else GateModel(id=model.id, name=model.name, version=model.version)


def _bad_query(name: str, value: Any, msg: str) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": ("query", name), "input": value, "msg": msg}])


def parse_targets(values: list[str] | None) -> list[str] | None:
    """Targets as repeated parameters or comma-separated, each BACKEND/ARCH; 422 naming the bad one."""
    if not values:
        return None
    out: list[str] = []
    for item in (part.strip() for value in values for part in value.split(",")):
        if not item:
            continue
        try:
            target = str(Target.parse(item))
        except ValueError as exc:
            raise _bad_query("targets", item, str(exc)) from None
        if target not in out:
            out.append(target)
    return out or None


def _latest_tasks(
    session: Session, model_ids: list[int], build_id: int | None, spec_hash: str | None
) -> dict[str, BuildTaskRow]:
    """Target → the task that answers for it: of the build asked for, else of the newest build that has one."""
    if build_id is not None:
        build = catalog.build_of_models(session, build_id, model_ids)
        if build is None:
            raise _bad_query(
                "build_id",
                build_id,
                f"build {build_id} is not a build of this model; see GET /v1/builds?model_id=… for its builds",
            )
        return {t.target: t for t in build.tasks}
    return catalog.latest_task_per_target(session, model_ids, spec_hash)


def evaluate(
    session: Session,
    settings: Settings,
    model_id: int,
    project: str | None,
    *,
    max_regression_pct: float = 10.0,
    pending: Literal["pass", "fail"] = "pass",
    targets: list[str] | None = None,
    build_id: int | None = None,
    spec_hash: str | None = None,
) -> GateOut:
    model = catalog.get_model(session, model_id, project)
    if model.source_model_id:  # a derived model is gated with its source version, where its builds start
        model = catalog.get_model(session, model.source_model_id)
    family = [model.id, *(m.id for m in catalog.derived_models(session, model))]
    tasks = _latest_tasks(session, family, build_id, spec_hash)
    names = targets or sorted(tasks)
    if build_id is not None and (missing := [t for t in names if t not in tasks]):
        raise _bad_query(
            "targets",
            missing,
            f"build {build_id} has no task for {', '.join(missing)}; its targets: {', '.join(tasks)}",
        )
    ids = [t.engine_id for t in tasks.values() if t.engine_id]
    # The model's project's own checks: another project sharing these engines cannot move the gate.
    engines, view, checks = checkstates.checks_of_ids(session, settings, ids, model.project)
    served = liveness.served_targets(session, settings.worker_ttl_seconds)
    previous, baseline, _ = reports.previous_measurements(session, model)
    judge = _Judge(max_regression_pct, previous, baseline, view)
    out = []
    for name in names:
        task = tasks.get(name)
        engine = engines.get(task.engine_id) if task is not None and task.engine_id else None
        items = judge.target(name, task, engine, checks.get(engine.id) if engine else None, served)
        out.append(
            GateTarget(
                target=name,
                verdict=_overall(items, pending),
                build_id=task.build_id if task else None,
                task_id=task.id if task else None,
                engine_id=engine.id if engine else None,
                spec_hash=engine.spec_hash if engine else None,
                checks=items,
            )
        )
    every = [c for t in out for c in t.checks]
    verdict = _overall(every, pending)
    counts = {v: sum(c.verdict == v for c in every) for v in ("pass", "fail", "pending")}
    return GateOut(
        model=_ident(model),
        previous=_ident(previous),
        max_regression_pct=max_regression_pct,
        pending=pending,
        verdict=verdict,
        reason=_reason(verdict, every, pending, bool(names)),
        counts=counts,
        targets=out,
    )


def _overall(checks: list[GateCheck], pending: str) -> Verdict:
    """Fail on any failure (a pending check counts as one when pending=fail and nothing will finish it);
    pending while anything is under way or a target has no engine yet; else pass."""
    waiting = [c for c in checks if c.verdict == "pending"]
    if any(c.verdict == "fail" for c in checks):
        return "fail"
    if any(c.in_progress or c.check == "build" for c in waiting):
        return "pending"
    if waiting and pending == "fail":
        return "fail"
    return "pass" if checks else "pending"


def _reason(verdict: Verdict, checks: list[GateCheck], pending: str, any_target: bool) -> str:
    if not any_target:
        return "the model has no build to gate; submit one (POST /v1/builds)"
    failed = [c for c in checks if c.verdict == "fail"]
    waiting = [c for c in checks if c.verdict == "pending"]
    if verdict == "fail":
        shown = failed or waiting  # with pending=fail, the pending checks are the failures
        what = "failed" if failed else "pending (pending=fail)"
        return f"{len(shown)} check(s) {what}: " + "; ".join(f"{c.target} {c.check}: {c.reason}" for c in shown)
    if verdict == "pending":
        busy = [c for c in waiting if c.in_progress or c.check == "build"]
        return f"{len(busy)} check(s) not decided yet: " + "; ".join(f"{c.target} {c.check}: {c.reason}" for c in busy)
    note = f"; {len(waiting)} pending on hardware the farm lacks, counted as passed (pending=pass)" if waiting else ""
    return f"all {len(checks) - len(waiting)} decided check(s) passed{note}"


def _check(
    target: str, check: CheckName, verdict: Verdict, reason: str, numbers: dict | None = None, in_progress: bool = False
) -> GateCheck:
    return GateCheck(
        target=target, check=check, verdict=verdict, reason=reason, numbers=numbers or {}, in_progress=in_progress
    )


class _Judge:
    def __init__(self, max_regression_pct: float, previous: ModelRow | None, baseline: dict, view: ProjectView):
        self.limit, self.previous, self.baseline, self.view = max_regression_pct, previous, baseline, view

    def target(
        self,
        name: str,
        task: BuildTaskRow | None,
        engine: EngineRow | None,
        check: dict[str, Any] | None,
        served: dict[str, set[str]],
    ) -> list[GateCheck]:
        build = self._build(name, task, served)
        if engine is None:  # nothing to measure: every later check follows the build
            waits = build.verdict == "pending"
            verdict: Verdict = "pending" if waits else "fail"
            reason = f"waits for the build: {build.reason}" if waits else "no engine: the build did not succeed"
            return [build, *(_check(name, c, verdict, reason, None, waits and build.in_progress) for c in CHECKS[1:])]
        assert check is not None  # engine_checks has an entry for every engine it was given
        return [
            build,
            self._benchmark(name, engine, check),
            self._accuracy(name, engine, check),
            self._latency(name, engine, check),
        ]

    @staticmethod
    def _build(name: str, task: BuildTaskRow | None, served: dict[str, set[str]]) -> GateCheck:
        if task is None:
            return _check(name, "build", "fail", f"the model has no build for {name}; submit one (POST /v1/builds)")
        numbers = {
            "build_id": task.build_id,
            "task_id": task.id,
            "state": task.state,
            "engine_id": task.engine_id,
            "reused": task.reused,
        }
        if task.state == TaskState.SUCCEEDED.value:
            how = "reused an identical engine" if task.reused else "built"
            return _check(name, "build", "pass", f"{how}: engine {task.engine_id}", numbers)
        if task.state in (TaskState.FAILED.value, TaskState.CANCELLED.value):
            return _check(name, "build", "fail", f"build {task.state}: {task.error or 'no reason recorded'}", numbers)
        detail = services.task_wait_reason(task, served)
        busy = not (task.state == TaskState.QUEUED.value and task.target not in served)
        return _check(name, "build", "pending", detail or f"build {task.state}", numbers, busy)

    def _benchmark(self, name: str, engine: EngineRow, check: dict[str, Any]) -> GateCheck:
        shapes = [
            {
                "shape_key": b.shape_key,
                "device": b.stats.get("device") or b.gpu_name,
                "median_ms": b.median_ms,
                "p99_ms": b.p99_ms,
                "throughput_qps": b.throughput_qps,
            }
            for b in self.view.benchmarks(engine)
        ]
        state, detail, numbers = check["state"], check["detail"], {"shapes": shapes}
        if state == "succeeded" and shapes:
            where = ", ".join(f"{s['shape_key']} {s['median_ms']:.3f} ms" for s in shapes)
            return _check(name, "benchmark", "pass", f"measured: median {where}", numbers)
        if state == "failed":
            return _check(name, "benchmark", "fail", detail, numbers)
        return _check(name, "benchmark", "pending", detail or f"benchmark {state}", numbers, check["in_progress"])

    def _accuracy(self, name: str, engine: EngineRow, check: dict[str, Any]) -> GateCheck:
        result = self.view.accuracy(engine) or {}
        passed = self.view.accuracy_pass(engine)
        numbers = {
            "metrics": result.get("worst", {}),
            "limits": result.get("limits", {}),
            "reference": result.get("reference"),
        }
        if check["in_progress"]:  # a new check of this engine is under way: its verdict is the one that counts
            return _check(name, "accuracy", "pending", check["detail"] or "accuracy check under way", numbers, True)
        if passed is True:
            cosine = numbers["metrics"].get("cosine")
            shown = f" (cosine {cosine:.6f})" if isinstance(cosine, float) else ""
            reason = f"outputs match {numbers['reference'] or 'the reference'} within the limits{shown}"
            return _check(name, "accuracy", "pass", reason, numbers)
        if passed is False:
            broken = "; ".join(result.get("failures") or []) or result.get("error") or "outside the limits"
            return _check(name, "accuracy", "fail", f"accuracy check failed: {broken}", numbers)
        if check["state"] == "failed":
            return _check(name, "accuracy", "fail", f"the accuracy check did not run: {check['detail']}", numbers)
        return _check(name, "accuracy", "pending", check["detail"] or "no accuracy result yet", numbers)

    def _latency(self, name: str, engine: EngineRow, check: dict[str, Any]) -> GateCheck:
        numbers: dict[str, Any] = {
            "limit_pct": self.limit,
            "previous_version": self.previous.version if self.previous else None,
        }
        measured = self.view.benchmarks(engine)
        if check["in_progress"] or (not measured and check["state"] != "failed"):
            reason = f"no latency to compare yet: {check['detail'] or check['state']}"
            return _check(name, "latency_regression", "pending", reason, numbers, check["in_progress"])
        if not measured:
            return _check(name, "latency_regression", "fail", f"no latency measured: {check['detail']}", numbers)
        if self.previous is None:
            reason = "first version of the model: nothing to compare against"
            return _check(name, "latency_regression", "pass", reason, numbers)
        compared = []
        for b in measured:
            match = self.baseline.get(reports.measurement_key(engine, b))
            if match is None:
                continue
            before_engine, before = match
            compared.append(
                {
                    "shape_key": b.shape_key,
                    "device": b.stats.get("device") or b.gpu_name,
                    "median_ms": b.median_ms,
                    "previous_median_ms": before.median_ms,
                    "previous_engine_id": before_engine.id,
                    "change_pct": (b.median_ms / before.median_ms - 1) * 100 if before.median_ms else None,
                }
            )
        numbers["shapes"] = compared
        version = f"version {self.previous.version}"
        if not compared:
            reason = f"{version} has no measurement on {name} with the same spec, shape and device to compare against"
            return _check(name, "latency_regression", "pass", reason, numbers)
        worst = max(compared, key=lambda c: c["change_pct"] if c["change_pct"] is not None else float("-inf"))
        if worst["change_pct"] is None:  # a baseline of 0 ms: no ratio to judge
            return _check(name, "latency_regression", "pass", f"{version} measured 0 ms: no ratio to compare", numbers)
        line = (
            f"median {worst['median_ms']:.3f} ms vs {worst['previous_median_ms']:.3f} ms in {version} "
            f"({worst['change_pct']:+.1f}%, limit +{self.limit:g}%) at {worst['shape_key']} on {worst['device']}"
        )
        if worst["change_pct"] > self.limit:
            return _check(name, "latency_regression", "fail", f"latency regressed: {line}", numbers)
        return _check(name, "latency_regression", "pass", f"within the limit: {line}", numbers)
