"""ONNX Runtime's CPU int8, chosen by measurement: each candidate recipe that applies to the model is quantized,
built as a CPU artifact, checked against the fp32 artifact on a calibration batch and timed against it,
interleaved, on this worker; the fastest that passes the int8 gate is kept.

Which int8 form pays depends on the network and on the CPU (worker/int8/quantize/__init__.py, docs/models.md).
The figures of every candidate go into the quantize report (``candidates``), so a build shows what was tried and
why one was kept. Called by the quantize stage (worker/int8/stage.py) for the ``onnxruntime`` family.
"""

from __future__ import annotations

import logging
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.core.domain import ModelInfo
from enginefarm.core.errors import BuildFailed
from enginefarm.core.spec import BuildSpec, Precision
from enginefarm.graph.inputs import opt_shape_set, sample_batches
from enginefarm.measure import check
from enginefarm.measure.check import Reference
from worker.backends import ort_artifact
from worker.int8.quantize import QuantizeReport, cpu_candidates, quantize_for_spec
from worker.int8.quantize.files import remove_model_files
from worker.measure.evaluate import accuracy_inputs, benchmark_inputs, reference_outputs
from worker.measure.int8_vs_fp32 import interleaved_rounds, verdict

log = logging.getLogger(__name__)

# Candidates whose speed-ups differ by less than this fraction count as equally fast: the earlier one in
# CPU_CANDIDATES' order is kept (timing on a shared CPU moves by a few percent from run to run).
SAME_SPEED = 0.03
# A candidate whose rounds are faster than another's by this much (the median of the paired ratios) wins with most
# rounds rather than all but one.
WIDE_MARGIN = 0.2
# Rounds of timing blocks per candidate (each block at least one call): enough that a busy CPU falls on all alike.
TIMING_ROUNDS = 6
TIMING_BLOCK_S = 0.2


def _clearly_faster(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether candidate ``a`` is faster than ``b`` beyond this machine's noise: by more than ``SAME_SPEED`` over
    the whole run, and in all rounds but at most one, each round's figures taken side by side in time (a paired
    comparison: a busy moment slows both); or by a wide margin (``WIDE_MARGIN``: the median of the rounds' paired
    ratios) in most rounds, where one or two disturbed rounds would otherwise keep a much slower form. Without
    per-round figures, by ``SAME_SPEED`` alone."""
    if a["speedup"] < b["speedup"] * (1 + SAME_SPEED):
        return False
    ra, rb = a.get("round_speedups"), b.get("round_speedups")
    if not ra or not rb or len(ra) != len(rb):
        return True
    wins = sum(x > y for x, y in zip(ra, rb))
    if wins >= len(ra) - 1:
        return True
    return wins > len(ra) / 2 and statistics.median(x / y for x, y in zip(ra, rb) if y > 0) >= 1 + WIDE_MARGIN


def pick(candidates: list[dict[str, Any]]) -> tuple[str | None, str]:
    """The candidate to keep, and why, from the measured figures (``name``, ``pass``, ``speedup``, ``cosine``;
    ``round_speedups`` where timed by round; ``error`` where one failed). The fastest that passed the gate, unless
    it is not clearly faster (``_clearly_faster``) than one before it in the list: then the first of those. So a
    model gets the same form build after build unless one form is faster on this CPU by more than its noise. If
    none passed, the most accurate, so that the engine's own check says it fails."""
    measured = [c for c in candidates if "error" not in c]
    if not measured:
        return None, "no candidate quantized"
    passed = [c for c in measured if c["pass"]]
    if passed:
        best = max(passed, key=lambda c: c["speedup"])
        keep = next(c for c in passed if c is best or not _clearly_faster(best, c))
        why = f"fastest that passed the int8 gate: {keep['speedup']:.2f}x fp32"
        if keep is not best:
            why = (
                f"first that passed the int8 gate among those as fast as the fastest within this CPU's noise: "
                f"{keep['speedup']:.2f}x fp32 ({best['name']} {best['speedup']:.2f}x is not faster in enough rounds)"
            )
        elif len(passed) > 1:
            why += " (" + ", ".join(f"{c['name']} {c['speedup']:.2f}x" for c in passed if c is not keep) + ")"
        if keep["speedup"] <= 1.0:
            why += "; no candidate is faster than fp32 on this CPU"
        return keep["name"], why
    keep = max(measured, key=lambda c: c["cosine"])
    return keep["name"], f"no candidate passed the int8 gate; kept the most accurate (cosine {keep['cosine']:.4f})"


def quantize_for_cpu(
    float_model: Path,
    samples: dict[str, np.ndarray],
    out: Path,
    spec: BuildSpec,
    info: ModelInfo,
    scratch: Path,
    make_runner,
    reference_model: Path | None = None,
) -> QuantizeReport:
    """Quantize ``float_model`` for ONNX Runtime's CPU into ``out`` with the candidate that measured best here.
    ``make_runner(path)`` opens an artifact as the benchmark stage does. ``reference_model``: the model the
    accuracy check runs in fp32, the uploaded one (default ``float_model``, which must then take every input the
    spec fixes). A bad spec or bad samples raise as the quantizer raises them; BuildFailed only when every
    candidate failed to quantize."""
    return quantize_for_cpu_beside(
        float_model, samples, out, spec, info, scratch, make_runner, {}, reference_model or float_model
    )[0]


def quantize_for_cpu_beside(
    float_model: Path,
    samples: dict[str, np.ndarray],
    out: Path,
    spec: BuildSpec,
    info: ModelInfo,
    scratch: Path,
    make_runner,
    beside: dict[str, Path],
    reference_model: Path,
) -> tuple[QuantizeReport, dict[str, dict[str, Any]]]:
    """``quantize_for_cpu``, with the int8 models of ``beside`` (name -> model; never kept) judged and timed in the
    same interleaved run as fp32 and the candidates; returns the report and each of those models' figures (as a
    candidate's: pass, cosine, speedup, int8_median_ms, vs_fp32; or error)."""
    names = cpu_candidates(float_model)
    work = Path(tempfile.mkdtemp(prefix="int8-candidates-", dir=scratch))
    reports: dict[str, QuantizeReport] = {}
    figures: list[dict[str, Any]] = []
    first_error: BuildFailed | None = None
    for name in names:
        path = work / name / out.name
        path.parent.mkdir()
        try:
            reports[name] = quantize_for_spec(float_model, samples, path, spec, "onnxruntime", work, recipe=name)
        except BuildFailed as exc:
            first_error = first_error or exc
            figures.append({"name": name, "error": str(exc)})
    if not reports:
        assert first_error is not None
        raise first_error
    others = {f"beside-{n}": path for n, path in beside.items()}  # never a candidate's name
    try:
        figures += _measure(
            {**{n: work / n / out.name for n in reports}, **others},
            float_model,
            reference_model,
            samples,
            spec,
            info,
            work,
            make_runner,
        )
    except Exception as exc:
        log.warning("int8 candidates could not be measured: %s", exc, exc_info=True)
        figures += [{"name": n, "error": f"not measured: {type(exc).__name__}: {exc}"} for n in [*reports, *others]]
    measured_beside = {c["name"].removeprefix("beside-"): c for c in figures if c["name"] in others}
    figures = [c for c in figures if c["name"] not in others]
    order = {n: i for i, n in enumerate(names)}
    figures.sort(key=lambda c: order[c["name"]])
    chosen, why = pick(figures)
    chosen = chosen or next(iter(reports))  # measurement failed: the first that quantized, as before choosing
    remove_model_files(out)
    for kept in (work / chosen / out.name, work / chosen / f"{out.name}.data"):
        if kept.exists():  # the data file keeps its name, which the model refers to
            kept.replace(out.parent / kept.name)
    report = reports[chosen]
    keep = next(c for c in figures if c["name"] == chosen)
    report.vs_fp32 = keep.get("vs_fp32") or {"error": keep.get("error", "not measured")}
    report.candidates = [
        {
            **{k: v for k, v in c.items() if k != "vs_fp32"},
            "kept": c["name"] == chosen,
            **({"why": why} if c["name"] == chosen else {}),
        }
        for c in figures
    ]
    shutil.rmtree(work, ignore_errors=True)
    return report, {n: {**c, "name": n} for n, c in measured_beside.items()}


def gate_figure(runner, ref: Reference, limits: dict[str, float]) -> dict[str, Any]:
    """An int8 artifact's outputs on ``ref``'s inputs against its outputs, under ``limits``, by the accuracy
    check's own code (``enginefarm.measure.check``): pass, the worst cosine, and the limits it broke."""
    return gate_of([runner.infer(feed) for feed in ref.feeds], ref, limits)


def gate_of(outputs: list[dict[str, np.ndarray]], ref: Reference, limits: dict[str, float]) -> dict[str, Any]:
    """``gate_figure`` on outputs already computed, one dict per feed of ``ref``."""
    judged = check.judge(outputs, ref, limits)
    return {
        "pass": judged["pass"],
        "cosine": round(judged["worst"].get("cosine", 1.0), 6),
        **({"failures": judged["failures"]} if not judged["pass"] else {}),
    }


def screening_inputs(float_model: Path, samples: dict[str, np.ndarray], info: ModelInfo) -> Reference:
    """What the accuracy repair's search screens each set of layers on, many times over: the first two calibration
    samples, one per batch, against ONNX Runtime fp32 on ``float_model`` (the model as quantized, its fixed inputs
    already constants). Candidates and the kept form are judged on the accuracy check's own inputs instead
    (``worker.measure.evaluate.accuracy_inputs``)."""
    feeds = [{n: a for n, a in feed.items() if n in samples} for feed in sample_batches(samples, info, 1)[:2]]
    return reference_outputs(float_model, feeds, f"the first {len(feeds)} calibration sample(s), one per batch")


def _measure(
    models: dict[str, Path],
    float_model: Path,
    reference_model: Path,
    samples: dict[str, np.ndarray],
    spec: BuildSpec,
    info: ModelInfo,
    work: Path,
    make_runner,
) -> list[dict[str, Any]]:
    """Each int8 model built as a CPU artifact, judged as the engine's accuracy check will judge it (its inputs,
    ONNX Runtime fp32 on ``reference_model``, its code), and timed against the fp32 artifact, interleaved, at the
    spec's opt shapes."""
    built = {
        name: ort_artifact(
            model, spec, work / "artifacts" / f"{name}.onnx", Precision.FP32 if name == "fp32" else Precision.INT8
        )
        for name, model in {"fp32": float_model, **models}.items()
    }
    ref = accuracy_inputs(reference_model, spec, info, samples)
    runners = {name: make_runner(path) for name, path in built.items()}
    try:
        limits = spec.accuracy.limits(Precision.INT8.value)
        out: list[dict[str, Any]] = []
        for name in models:
            out.append({"name": name, **gate_figure(runners[name], ref, limits), "judged_on": ref.origin})
        # Timed at the shape the benchmark stage times first (the spec's opt shapes), on the same inputs.
        timed, _ = benchmark_inputs(spec, info, opt_shape_set(spec, info), samples)
        names = ["fp32", *models]
        by_round = interleaved_rounds(
            [lambda r=runners[n]: r.infer(timed) for n in names], rounds=TIMING_ROUNDS, block_s=TIMING_BLOCK_S
        )
        times = [[ms for block in blocks for ms in block] for blocks in by_round]
        fp32_ms = times[0]
        for figure, int8_ms, blocks in zip(out, times[1:], by_round[1:]):
            figure["vs_fp32"] = {
                **verdict(int8_ms, fp32_ms, TIMING_ROUNDS),
                "inputs": "the spec's opt shapes, inputs as the benchmark stage makes them",
                "method": "interleaved with the other candidates, same runner and threads",
            }
            figure["speedup"] = figure["vs_fp32"]["speedup"]
            figure["round_speedups"] = [
                round(statistics.median(f) / statistics.median(c), 3) for f, c in zip(by_round[0], blocks)
            ]
            figure["int8_median_ms"] = round(statistics.median(int8_ms), 4)
        return out
    finally:
        for runner in runners.values():
            runner.close()
