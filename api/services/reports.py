"""The read side of the benchmark stage: a model's report with the regression against version N-1, and a sweep's
variants with the best per target (where each engine's checks stand is ``checkstates``)."""

from __future__ import annotations

import math
from typing import Any, cast

from sqlalchemy.orm import Session

from api.schemas.builds import build_state
from api.schemas.int8 import engine_int8
from api.schemas.reports import LATENCY_KEYS
from api.services import fleet
from api.services.checkstates import engine_checks
from enginefarm.core.choose import QUANTIZED, most_shared
from enginefarm.core.config import Settings
from enginefarm.core.shapes import shapes_key
from enginefarm.core.spec import DEFAULT_SHAPE_KEY
from storage import builtengines, catalog, quantizing
from storage import checks as project_checks
from storage.checks import ProjectView
from storage.tables import BenchmarkRow, EngineRow, ModelRow, SweepRow


def _label(spec: dict[str, Any]) -> str:
    return f"{spec.get('precision', 'fp32')} opt{spec.get('optimization_level', 3)}"


def distinguish_variants(rows: list[dict[str, Any]]) -> None:
    """Two builds of a target with the same label ("int8 opt3" twice: other shapes, another calibration) read as
    duplicates: where a label stands for several specs of one target, each such row's label gets its spec's short
    hash (``enginefarm ls builds`` and the build page show the spec)."""
    specs: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        specs.setdefault((r["target"], r["variant"]), set()).add(r["spec_hash"])
    for r in rows:
        if len(specs[(r["target"], r["variant"])]) > 1:
            r["variant"] = f"{r['variant']} · spec {r['spec_hash'][:8]}"


def _preparation(spec: dict[str, Any]) -> str | None:
    """What was done to the graph before it was built, as the report prints it; None when nothing."""
    parts = []
    if spec.get("graph_cleanup", "none") != "none":
        parts.append(f"cleanup {spec['graph_cleanup']}")
    if spec.get("fixed_inputs"):
        parts.append("fixed " + ", ".join(f"{k}={v}" for k, v in spec["fixed_inputs"].items()))
    keep = [*spec.get("keep_fp32_ops", []), *spec.get("keep_fp32_layers", [])]
    if keep and spec.get("precision") in ("fp16", "bf16"):
        parts.append("kept fp32: " + ", ".join(keep))
    return "; ".join(parts) or None


def headline(engine: EngineRow, view: ProjectView) -> BenchmarkRow | None:
    """The benchmark a variant is ranked by: at the opt shapes (else the first shape), fastest device."""
    rows = view.benchmarks(engine)
    if not rows:
        return None
    at_opt = [b for b in rows if b.shape_key == DEFAULT_SHAPE_KEY] or [
        b for b in rows if b.shape_key == rows[0].shape_key
    ]
    return min(at_opt, key=lambda b: b.median_ms, default=None)


def best_per_target(engines: list[EngineRow], view: ProjectView) -> dict[str, int | None]:
    """Target → the fastest engine among those that passed the accuracy gate and were measured at the same input
    shapes, where the target has several variants; None while no variant has both a measurement and a passed
    check."""
    by_target: dict[str, list[EngineRow]] = {}
    for e in engines:
        by_target.setdefault(e.target, []).append(e)
    best: dict[str, int | None] = {}
    for target, group in by_target.items():
        if len(group) < 2:
            continue
        passed = [(h, e) for e in group if view.accuracy_pass(e) and (h := headline(e, view)) is not None]
        best[target] = _fastest(passed).id if passed else None
    return best


def _fastest(passed: list[tuple[BenchmarkRow, EngineRow]]) -> EngineRow:
    """The fastest of a target's passing variants by their headline benchmarks. Latencies compare only at the same
    input shapes (two builds' opt shapes may differ): where the variants were not all measured at the same shapes,
    fp32/fp16 go before int8/fp8, as resolving ranks them, then the latencies at the shapes most of them share."""
    at: dict[str, list[float]] = {}
    for h, _ in passed:
        at.setdefault(shapes_key(h.shapes), []).append(h.median_ms)
    common = most_shared(at)
    assert common is not None  # passed, so at, is never empty
    alike = len(at[common]) == len(passed)

    def rank(item: tuple[BenchmarkRow, EngineRow]) -> tuple[int, float]:
        h, e = item
        tier = 0 if alike or e.precision not in QUANTIZED else 1
        return tier, h.median_ms if shapes_key(h.shapes) == common else math.inf

    return min(passed, key=rank)[1]


def _accuracy_of(engine: EngineRow, view: ProjectView) -> dict[str, Any] | None:
    result = view.accuracy(engine)
    if result is None:
        return None
    return {
        "pass": view.accuracy_pass(engine),
        "metrics": result.get("worst", {}),
        "limits": result.get("limits", {}),
        "reference": result.get("reference"),
        "inputs": result.get("inputs"),
        "error": result.get("error"),
        "explained_by": result.get("explained_by"),
        "note": (result.get("tf32") or {}).get("note"),
    }


def _phase(stats: dict, name: str) -> dict | None:
    phase = stats.get(name)
    return {k: phase[k] for k in LATENCY_KEYS if k in phase} if phase else None


def _regression(
    now: BenchmarkRow, before: BenchmarkRow, engine: EngineRow, previous: EngineRow, view: ProjectView
) -> dict[str, Any]:
    def delta(a, b):
        return None if a is None or b is None else a - b

    cos_now = (view.accuracy(engine) or {}).get("worst", {}).get("cosine")
    cos_before = (view.accuracy(previous) or {}).get("worst", {}).get("cosine")
    return {
        "previous_engine_id": previous.id,
        "median_ms": before.median_ms,
        "median_ms_delta": now.median_ms - before.median_ms,
        "median_ratio": now.median_ms / before.median_ms if before.median_ms else None,
        "p99_ms_delta": delta(now.p99_ms, before.p99_ms),
        "throughput_delta": delta(now.throughput_qps, before.throughput_qps),
        "size_delta": engine.size - previous.size,
        "cosine_delta": delta(
            cos_now if isinstance(cos_now, float) else None, cos_before if isinstance(cos_before, float) else None
        ),
    }


def measurement_key(engine: EngineRow, bench: BenchmarkRow) -> tuple:
    """What a measurement is compared by across versions: same target, spec, shape and GPU."""
    return engine.target, engine.spec_hash, bench.shape_key, bench.gpu_name


def previous_measurements(
    session: Session, model: ModelRow
) -> tuple[ModelRow | None, dict[tuple, tuple[EngineRow, BenchmarkRow]], ProjectView]:
    """Version N-1 of an uploaded model (derived models are variants, never versions) and the model's project's
    measurements of it by ``measurement_key``: the baseline of the report's deltas and of the regression gate; and
    that project's view of N-1's engines."""
    previous = catalog.previous_version(session, model)
    before: dict[tuple, tuple[EngineRow, BenchmarkRow]] = {}
    engines = (
        builtengines.engines_of_models(session, [previous, *catalog.derived_models(session, previous)])
        if previous is not None
        else []
    )
    view = project_checks.project_view(session, engines, model.project)
    for e in engines:
        for b in view.benchmarks(e):
            before.setdefault(measurement_key(e, b), (e, b))
    return previous, before, view


def model_report(session: Session, settings: Settings, model_id: int, project: str | None = None) -> dict[str, Any]:
    """For every engine of the model and every shape it was measured at: latency percentiles, throughput,
    accuracy and size, or why it has no numbers yet; plus the change against version N-1, and what the int8 stage
    did for each int8 engine the farm quantized (``int8``: candidates, accuracy repair, fp32/int8 latency)."""
    model = catalog.get_model(session, model_id, project)
    if model.source_model_id:  # a derived model reports under its source, where its engines are listed
        model = catalog.get_model(session, model.source_model_id)
    family = [model, *catalog.derived_models(session, model)]
    # The checks are read before their evidence: a check's figures, verdict and end commit together, so a check
    # read as finished has its figures seen by the reads after (read the other way, a finished check could show none).
    tasks = project_checks.benchmark_tasks_of_shas(session, sorted({m.sha256 for m in family}), model.project)
    engines = builtengines.engines_of_models(session, family)
    # The model's project's evidence only: another project's checks of the same bytes are not this report's.
    view = project_checks.project_view(session, engines, model.project)
    checks = engine_checks(session, settings, engines, view, tasks)
    builds = catalog.builds_by_spec(session, [m.id for m in family])
    best = best_per_target(engines, view)
    previous, before, before_view = previous_measurements(session, model)
    view.verdicts.update(before_view.verdicts)
    measured_by_fleet = fleet.by_engine(session, [e.id for e in engines], model.project)
    rows = []
    for e in engines:
        build = builds.get(e.spec_hash)
        base = {
            "engine_id": e.id,
            "target": e.target,
            "backend": e.backend,
            "precision": e.precision,
            "spec_hash": e.spec_hash,
            "variant": (
                build.variant
                if build and build.variant
                else _label(build.spec if build else {"precision": e.precision})
            ),
            "best": (best[e.target] == e.id) if e.target in best else None,
            "size": e.size,
            "profiles": e.profiles or [],
            "accuracy": _accuracy_of(e, view),
            "derived_from": model.id if e.model_sha256 != model.sha256 else None,
            "preparation": _preparation(build.spec) if build else None,
            "check": {"state": checks[e.id]["state"], "detail": checks[e.id]["detail"]},
            "fleet": [f.model_dump(mode="json") for f in measured_by_fleet.get(e.id, [])],
        }
        measured = view.benchmarks(e)
        if not measured:
            status = checks[e.id]
            rows.append(
                {
                    **base,
                    "shape_key": None,
                    "batch": None,
                    "device": None,
                    "status": "failed" if status["state"] == "failed" else "pending",
                    "detail": status["detail"],
                    "latency_ms": None,
                    "compute_ms": None,
                    "h2d_ms": None,
                    "d2h_ms": None,
                    "throughput_qps": None,
                    "regression": None,
                }
            )
            continue
        for b in measured:
            match = before.get(measurement_key(e, b))
            rows.append(
                {
                    **base,
                    "shape_key": b.shape_key,
                    "shapes": b.shapes,
                    "batch": b.stats.get("batch"),
                    "device": b.stats.get("device") or b.gpu_name,
                    "status": "measured",
                    "detail": None,
                    "latency_ms": _phase(b.stats, "e2e"),
                    "compute_ms": _phase(b.stats, "compute"),
                    "h2d_ms": _phase(b.stats, "h2d"),
                    "d2h_ms": _phase(b.stats, "d2h"),
                    "throughput_qps": b.throughput_qps,
                    "stats": b.stats,
                    "measured_at": b.created_at.isoformat(),
                    "regression": _regression(b, match[1], e, match[0], view) if match else None,
                }
            )
    distinguish_variants(rows)
    ident = lambda m: {"id": m.id, "name": m.name, "version": m.version, "sha256": m.sha256}  # noqa: E731
    # Engines measured before whose new check (other settings) is still under way count too.
    in_progress = sorted(e.id for e in engines if checks[e.id]["in_progress"])
    staged = [e.id for e in engines if e.precision in ("int8", "fp16")]
    stages = quantizing.quantizing_builds(session, staged, model.project)
    found = [s for e in engines if (s := engine_int8(e, stages.get(e.id), view.benchmarks(e))) is not None]
    return {
        "model": ident(model),
        "previous": ident(previous) if previous else None,
        "rows": rows,
        "checks_in_progress": in_progress,
        "int8": [s.model_dump(mode="json") for s in found if s.precision == "int8"],
        "fp16": [s.model_dump(mode="json") for s in found if s.precision == "fp16"],
    }


def sweep_report(session: Session, settings: Settings, sweep_id: int, project: str | None = None) -> dict[str, Any]:
    """A sweep's variants, each with its engine per target, its headline latency and accuracy, and the best."""
    sweep: SweepRow = catalog.get_sweep(session, sweep_id, project)
    # A task's engine_id is a foreign key to a stored engine, which the catalog never deletes.
    engines = cast(
        "list[EngineRow]", [session.get(EngineRow, t.engine_id) for b in sweep.builds for t in b.tasks if t.engine_id]
    )
    view = project_checks.project_view(session, engines, catalog.get_model(session, sweep.model_id).project)
    checks = engine_checks(session, settings, engines, view)
    best_engine = best_per_target(engines, view)
    variants = []
    best_build: dict[str, int | None] = {t: None for t in sweep.targets}
    states = set()
    for build in sweep.builds:
        items: list[dict[str, Any]] = []
        for task in build.tasks:
            states.add(task.state)
            engine = session.get(EngineRow, task.engine_id) if task.engine_id else None
            head = headline(engine, view) if engine else None
            is_best = engine is not None and best_engine.get(task.target) == engine.id
            if is_best:
                best_build[task.target] = build.id
            items.append(
                {
                    "target": task.target,
                    "task_state": task.state,
                    "engine_id": task.engine_id,
                    "median_ms": head.median_ms if head else None,
                    "p99_ms": head.p99_ms if head else None,
                    "device": (head.stats.get("device") if head else None),
                    "accuracy_pass": view.accuracy_pass(engine) if engine else None,
                    "checks": checks.get(engine.id) if engine else None,
                    "best": is_best,
                }
            )
        variants.append(
            {
                "build_id": build.id,
                "variant": build.variant,
                "spec_hash": build.spec_hash,
                "overrides": {k: build.spec.get(k) for k in sweep.axes},
                "state": build_state(build.tasks),
                "engines": items,
            }
        )
        states.update(i["checks"]["state"] for i in items if i["checks"])
    done = not states & {"queued", "running", "waiting", "pending"}
    return {
        "id": sweep.id,
        "model_id": sweep.model_id,
        "axes": sweep.axes,
        "targets": sweep.targets,
        "created_at": sweep.created_at,
        "state": "done" if done else "running",
        "variants": variants,
        "best": best_build,
    }
