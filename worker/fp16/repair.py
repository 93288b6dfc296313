"""Accuracy repair of fp16: which nodes break the fp16 gate, measured, and the fewest kept in fp32 that let it pass.

Every figure here is the fp16 gate itself, measured on the farm's ONNX Runtime artifact, on the GPU where the build
has an ``onnxruntime/cuda`` target this worker runs (worker/fp16/stage.py picks it), else on the CPU: the model
converted by ``worker/rewrite/fp16`` with a set of nodes kept in fp32 (``keep_fp32_layers``), optimized as the
``onnxruntime`` backend builds it, run on the accuracy check's inputs (the model's samples, else its seeded random
inputs) and judged against ONNX Runtime fp32 on the original model under the spec's fp16 limits (elementwise
atol/rtol with the share of elements allowed outside them, by default). Nothing is estimated and nothing is timed:
the same model, samples and spec give the same ranking and the same kept set.

1. **Needed?** The model is converted as the spec asks; if it passes, nothing is kept (``needed: false``).
2. **Sensitivity.** The candidates are the nodes the conversion made fp16. Up to ``NODE_LIMIT`` of them, each is kept
   in fp32 alone and the gate measured. Above that, one conversion per node costs too much (BERT-base has over a
   thousand): the candidates, in graph order, are cut into ``REGIONS`` contiguous regions, each kept in fp32 alone;
   then the region that helped most is halved and both halves measured, best first, until single nodes or
   ``PROBE_LIMIT`` measurements. Every group measured is ranked by the share of output elements left outside the
   tolerance with it in fp32, then the relative L2 error (the fewer nodes first on a tie).
3. **Search** (worker/repair.py, as for int8).
4. **An honest stop.** If the budget passes nothing, the report says so with the best figure reached and
   recommends fp32.

On the CPU the kept set is the one the CPU shows (``MEASURED_ON`` says why it can be smaller than a GPU's); judged on
the GPU, the one the CUDA provider's fp16 kernels show. Called by the fp16 repair stage (worker/fp16/stage.py); every
target's fp16 graph then keeps the set in fp32."""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from enginefarm.core.domain import ModelInfo, Target
from enginefarm.core.spec import BuildSpec, Precision
from worker.backends import cpu_target, ort_artifact
from worker.measure.evaluate import accuracy_inputs, compare
from worker.repair import RANKING_SHOWN, Timed, budget_of, not_needed, search
from worker.rewrite.onnxgraph import all_nodes

# Up to this many candidates, each node is measured alone; above, regions are bisected.
NODE_LIMIT = 48
REGIONS = 16
# The most gate measurements the bisection of regions makes.
PROBE_LIMIT = 64
MEASURED_ON = (
    "ONNX Runtime on the CPU: it runs most fp16 operators as fp32 kernels between casts and drops cast pairs, so "
    "fp16 error shows only where an fp16 tensor is materialized; a GPU's error can be larger"
)


def repair(
    float_model: Path,
    reference_model: Path,
    samples: dict[str, np.ndarray] | None,
    spec: BuildSpec,
    info: ModelInfo,
    scratch: Path,
    make_runner,
    judge_on: Target | None = None,
    measured_on: str = MEASURED_ON,
) -> dict[str, Any]:
    """Find the nodes to keep in fp32 so that the fp16 artifact of ``float_model`` (the model as the build prepares
    it) for ``judge_on`` (default: this worker's ONNX Runtime CPU target; an ``onnxruntime/cuda`` target judges on
    its GPU, ``make_runner`` then opening a CUDA runner) passes the fp16 gate against ``reference_model``; returns
    the repair report (``kept``: the node names, empty when nothing was needed or nothing passed; ``passed``)."""
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="fp16-repair-", dir=scratch))
    try:
        judge = Timed(_Judge(float_model, reference_model, samples, spec, info, work, make_runner, judge_on))
        base = list(spec.keep_fp32_layers)
        before = judge(base)
        report: dict[str, Any] = {
            "precision": Precision.FP16.value,
            "recipe": "worker/rewrite/fp16",
            "measured_on": measured_on,
            "judged_on": str(judge.target),
            "inputs": judge.inputs.origin,
            "before": before,
        }
        if before["pass"]:
            return not_needed(report, before, judge, started)
        candidates = judge.candidates
        budget = budget_of(len(candidates))
        ranked = _ranking(candidates, judge, base, before)
        probes = judge.calls - 1
        groups = [r["layers"] for r in ranked]
        kept, after = search(groups, budget, judge, base, score=score) if groups else (None, before)
        passed = kept is not None
        report.update(
            needed=True,
            passed=passed,
            kept=kept or [],
            after=after,
            method=(
                "each node converted to fp16 kept in fp32 alone"
                if len(candidates) <= NODE_LIMIT
                else f"{REGIONS} regions of the nodes converted to fp16, each kept in fp32 alone, the most helpful "
                "halved until single nodes"
            )
            + f", the fp16 gate measured on the {judge.target} artifact; then the top 1, 2, 4, ... kept until the "
            "gate passes, then unneeded ones dropped",
            ranking=ranked[:RANKING_SHOWN],
            candidates=len(candidates),
            budget=budget,
            probe_evaluations=probes,
            **judge.cost(started),
        )
        if not passed:
            best = after or before
            report["note"] = (
                f"no set of up to {budget} of the {len(candidates)} nodes converted to fp16, kept in fp32, passes "
                f"the fp16 gate (best: {best['violations']:.2%} of output elements outside the tolerance, cosine "
                f"{best['cosine']:.4f} against fp32): build fp32 for this model"
            )
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def score(figure: dict[str, Any]) -> tuple:
    """The higher, the better: fewer elements outside the tolerance, then integer outputs that agree more, then a
    smaller relative L2 error (none when an output was not finite)."""
    rel = figure.get("rel_l2")
    return (-figure["violations"], figure.get("agreement", 1.0), -(math.inf if rel is None else rel))


def _ranking(candidates: list[str], judge: Any, base: list[str], before: dict[str, Any]) -> list[dict[str, Any]]:
    """Every group measured, the most helpful first (on a tie, the fewer nodes, then graph order)."""
    measured: list[tuple[list[str], dict]] = []
    if len(candidates) <= NODE_LIMIT:
        measured = [([n], judge([*base, n])) for n in candidates]
    else:
        frontier: list[tuple[list[str], dict]] = []
        for region in _split(candidates, REGIONS):
            figure = judge([*base, *region])
            measured.append((region, figure))
            frontier.append((region, figure))
        while frontier and len(measured) < PROBE_LIMIT:
            frontier.sort(key=lambda m: score(m[1]), reverse=True)
            region, figure = frontier.pop(0)
            if len(region) < 2 or score(figure) <= score(before):
                continue
            for half in _split(region, 2):
                got = judge([*base, *half])
                measured.append((half, got))
                frontier.append((half, got))
    order = {name: i for i, name in enumerate(candidates)}
    measured.sort(key=lambda m: (tuple(-x for x in score(m[1])), len(m[0]), order[m[0][0]]))
    return [
        {
            "layers": group,
            "ops": [judge.ops[n] for n in group[:8]],
            "tensor": judge.outputs.get(group[0]) if len(group) == 1 else None,
            "violations_alone_float": figure["violations"],
            "violations_fp16": before["violations"],
            "cosine_alone_float": figure["cosine"],
            "cosine_fp16": before["cosine"],
            "pass_alone": figure["pass"],
        }
        for group, figure in measured
    ]


def _split(names: list[str], parts: int) -> list[list[str]]:
    """``names`` cut into at most ``parts`` contiguous runs of nearly equal length."""
    parts = max(1, min(parts, len(names)))
    size, extra = divmod(len(names), parts)
    out, at = [], 0
    for i in range(parts):
        step = size + (1 if i < extra else 0)
        out.append(names[at : at + step])
        at += step
    return [p for p in out if p]


class _Judge:
    """The fp16 artifact for ``target`` (default: the CPU's) with a set of nodes kept in fp32, judged by the fp16
    gate; figures cached by set."""

    def __init__(
        self,
        float_model: Path,
        reference_model: Path,
        samples,
        spec: BuildSpec,
        info: ModelInfo,
        work: Path,
        make_runner,
        target: Target | None = None,
    ):
        from worker.rewrite.fp16 import fp16_model

        self.float_model, self.spec, self.work, self.make_runner = float_model, spec, work, make_runner
        self.calls = 0
        self.seen: dict[frozenset[str], dict[str, Any]] = {}
        self.target = target or cpu_target()
        self.inputs = accuracy_inputs(reference_model, spec, info, samples)
        self.limits = spec.accuracy.limits(Precision.FP16.value)
        graph = onnx.load(str(float_model), load_external_data=False).graph
        nodes = list(all_nodes(graph))
        self.ops = {n.name: n.op_type for n in nodes if n.name}
        self.outputs = {n.name: n.output[0] for n in nodes if n.name and n.output}
        converted = fp16_model(
            float_model,
            work / "candidates" / "model.fp16.onnx",
            keep_fp32_op_types=spec.keep_fp32_ops,
            keep_fp32_nodes=spec.keep_fp32_layers,
            keep_io_types=spec.keep_io_types,
        )
        # Only nodes named in the model can be named in keep_fp32_layers; graph order, bodies where they sit.
        order = {n.name: i for i, n in enumerate(nodes) if n.name}
        self.candidates = sorted((n for n in set(converted.fp16_node_names) if n in order), key=order.__getitem__)
        shutil.rmtree(work / "candidates", ignore_errors=True)

    def __call__(self, keep: list[str]) -> dict[str, Any]:
        key = frozenset(keep)
        if key in self.seen:
            return self.seen[key]
        self.calls += 1
        out = self.work / f"try-{self.calls}" / "model.onnx"
        spec = self.spec.model_copy(update={"precision": Precision.FP16, "keep_fp32_layers": sorted(key)})
        runner = self.make_runner(ort_artifact(self.float_model, spec, out, target=self.target))
        try:
            figure = {**gate_figure(compare(runner, self.inputs, self.limits)), "kept": len(key)}
        finally:
            runner.close()
            shutil.rmtree(out.parent, ignore_errors=True)
        self.seen[key] = figure
        return figure


def gate_figure(judged: dict[str, Any]) -> dict[str, Any]:
    """An accuracy result (graph/accuracy.py's ``judge``) as a repair figure: pass, the worst cosine, the share of
    elements outside the tolerance, the worst relative L2 and max abs (null when an output was not finite)."""
    worst = judged["worst"]
    finite = all(math.isfinite(worst.get(k, 0.0)) for k in ("max_abs", "rel_l2"))
    figure: dict[str, Any] = {
        "pass": judged["pass"],
        "cosine": round(worst.get("cosine", 1.0), 6),
        "violations": round(worst.get("violations", 0.0), 6),
        "rel_l2": round(worst["rel_l2"], 6) if finite and "rel_l2" in worst else None,
        "max_abs": round(worst["max_abs"], 6) if finite and "max_abs" in worst else None,
    }
    if "agreement" in worst:
        figure["agreement"] = round(worst["agreement"], 6)
    if not finite:
        figure["non_finite"] = True
    if not judged["pass"]:
        figure["failures"] = judged["failures"]
    return figure
