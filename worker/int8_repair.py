"""Accuracy repair of int8: which layers break the gate, measured, and the smallest set kept in float that passes.

1. **Sensitivity.** The model is quantized once in Q/DQ form with the CPU recipe's settings; then, for each
   quantized activation, that tensor alone is put back in float (its readers take the tensor before its
   QuantizeLinear) and the output's cosine against fp32 is measured on the calibration batches (ONNX Runtime on the
   CPU, optimizations off, so every other pair stays as written). A tensor's figure goes to the layer whose
   quantization put the pair there: its producer where the operator format quantizes that op (an Add's output),
   else the quantized layers reading it. The most improving first is the ranking, by ONNX node name. A tensor-level
   signal-to-noise ratio was tried first and misranks: a tensor whose one huge channel dominates its power hides
   the small channels that int8's step wipes out.
2. **Search.** The top 1, 2, 4, ... layers of the ranking are kept in float until the int8 gate against fp32
   on the calibration batches passes, within a budget of a quarter of the quantized layers; then each kept layer
   that the gate does not need is dropped again, least sensitive first. The search judges on the same Q/DQ model
   with those layers' tensors put back in float (cheap: no quantizing); the set it finds is then quantized for real
   (``keep_fp32_layers``) and judged as the artifact, and only if that fails does the search run again with real
   quantization at each step.
3. **An honest stop.** If the budget passes nothing, the report says so with the figures and recommends fp16.

The same samples and spec give the same ranking and the same kept set: nothing here is timed. Called by the
quantize stage (worker/quantize_stage.py) when the spec asks ``accuracy_repair``; the kept set then applies to
every target family's int8 model.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from enginefarm.domain import Backend, ModelInfo, Target
from enginefarm.spec import BuildSpec, Precision
from enginefarm.worker.backends import BuildLog, get_backend
from enginefarm.worker.int8_choice import calibration_feeds, gate_figure
from enginefarm.worker.quantize import CPU_CANDIDATES, quantize_qdq

# The share of the quantized layers that may be kept in float before the repair gives up.
BUDGET = 0.25
# At most this many single-layer drops are tried after a passing set is found.
TRIM_TRIES = 8
RANKING_SHOWN = 20


def sensitivity(float_model: Path, samples: dict[str, np.ndarray], spec: BuildSpec, info: ModelInfo,
                work: Path) -> list[dict[str, Any]]:
    """Each quantized layer's share of the error, worst first: the output's cosine against fp32 with that layer's
    int8 tensor alone put back in float (``cosine_alone_float``), against all of them int8 (``cosine_int8``)."""
    return _Probe(float_model, samples, spec, info, work).ranking()


class _Probe:
    """The model quantized once in Q/DQ form, where putting a layer back in float is a graph edit (its readers
    take the tensor before its QuantizeLinear), judged at the output against fp32 without quantizing again."""

    def __init__(self, float_model: Path, samples: dict[str, np.ndarray], spec: BuildSpec, info: ModelInfo,
                 work: Path):
        import onnxruntime as ort

        self.ort = ort
        qdq = work / "sensitivity.onnx"
        recipe = replace(CPU_CANDIDATES["operator"], quant_format=_qdq_format(), name="sensitivity")
        quantize_qdq(float_model, samples, qdq, method=spec.calibration.method.value,
                     calibration_batch=spec.calibration.batch, family="onnxruntime", scratch=work, recipe=recipe,
                     keep_fp32_layers=spec.keep_fp32_layers, keep_fp32_ops=spec.keep_fp32_ops)
        self.model = onnx.load(str(qdq))
        self.feeds = calibration_feeds(samples, info)
        self.limits = spec.accuracy.limits(Precision.INT8.value)
        self.options = ort.SessionOptions()
        self.options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # pairs as written
        self.reference = self._outputs(str(float_model))
        self.pairs = _qdq_pairs(self.model.graph)
        self.owners = _owners(self.model.graph)
        self.readers = {after: [(n, i) for n in self.model.graph.node for i, x in enumerate(n.input) if x == after]
                        for _, after in self.pairs}
        self.base = self._judged(set())
        self.calls = 0

    def _outputs(self, source) -> list[dict[str, np.ndarray]]:
        session = self.ort.InferenceSession(source, self.options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return [dict(zip(names, session.run(names, feed))) for feed in self.feeds]

    def _judged(self, floats: set[str]) -> dict[str, Any]:
        """The gate figure with the pairs of these pre-quantization tensors put back in float."""
        edits = [(node, slot, before) for before, after in self.pairs if before in floats
                 for node, slot in self.readers[after]]
        originals = [node.input[slot] for node, slot, _ in edits]
        for node, slot, before in edits:
            node.input[slot] = before
        try:
            got = self._outputs(self.model.SerializeToString())
        finally:
            for (node, slot, _), name in zip(edits, originals):
                node.input[slot] = name
        return gate_figure(_Given(got), [{}] * len(got), self.reference, self.limits)

    def ranking(self) -> list[dict[str, Any]]:
        scores: dict[str, tuple[float, str]] = {}
        for before, _ in self.pairs:
            alone = self._judged({before})["cosine"]
            for owner in self.owners.get(before, []):
                if owner not in scores or alone > scores[owner][0]:
                    scores[owner] = (alone, before)
        ranked = sorted(scores.items(), key=lambda item: (-item[1][0], item[0]))
        return [{"node": name, "cosine_alone_float": round(value, 6), "cosine_int8": self.base["cosine"],
                 "tensor": tensor} for name, (value, tensor) in ranked]

    def __call__(self, layers: list[str]) -> dict[str, Any]:
        """The gate figure with these layers' int8 tensors in float (weights stay int8: an estimate)."""
        self.calls += 1
        kept = set(layers)
        return self._judged({before for before, owners in self.owners.items() if kept.intersection(owners)})


class _Given:
    """Outputs already computed, handed out in order as a runner would compute them."""

    def __init__(self, outputs: list[dict[str, np.ndarray]]):
        self.outputs = iter(outputs)

    def infer(self, feed) -> dict[str, np.ndarray]:
        return next(self.outputs)


def _cosine(reference: np.ndarray, got: np.ndarray) -> float:
    r, g = np.asarray(reference, np.float64).ravel(), np.asarray(got, np.float64).ravel()
    norms = float(np.linalg.norm(r) * np.linalg.norm(g))
    return float(r @ g / norms) if norms > 0 else float(np.array_equal(r, g))


def _owners(graph: onnx.GraphProto) -> dict[str, list[str]]:
    """For each float tensor that gets a Q/DQ pair, the layers whose quantization put it there: its producer
    where the operator format quantizes that op type (an Add's output), else the quantized layers reading it."""
    from onnxruntime.quantization.registry import QLinearOpsRegistry

    produced = {o: n for n in graph.node for o in n.output}
    dequantized = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    quantized = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    owners: dict[str, list[str]] = {}
    for q_out, before in quantized.items():
        producer = produced.get(before)
        if producer is not None and producer.op_type in QLinearOpsRegistry and producer.name:
            owners[before] = [producer.name]
            continue
        readers = {dq for dq, q in dequantized.items() if q == q_out}
        owners[before] = sorted({n.name for n in graph.node if n.name and readers.intersection(n.input)
                                 and n.op_type in QLinearOpsRegistry})
    return owners


def repair(float_model: Path, samples: dict[str, np.ndarray], spec: BuildSpec, info: ModelInfo, scratch: Path,
           make_runner, recipe: str = "operator") -> dict[str, Any]:
    """Find the layers to keep in float so that the CPU int8 artifact (``recipe``) passes the gate; returns the
    repair report (``kept``: the node names, empty when nothing was needed or nothing passed; ``passed``)."""
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="int8-repair-", dir=scratch))
    try:
        judge = _Judge(float_model, samples, spec, info, work, make_runner, recipe)
        before = judge(spec.keep_fp32_layers)
        report: dict[str, Any] = {"recipe": recipe, "before": before, "method": "SQNR of each int8 tensor alone, "
                                  "then the top 1, 2, 4, ... layers kept in float until the gate passes, then "
                                  "unneeded ones dropped"}
        if before["pass"]:
            return {**report, "needed": False, "passed": True, "kept": [], "after": before,
                    "evaluations": judge.calls, "seconds": round(time.perf_counter() - started, 2)}
        probe = _Probe(float_model, samples, spec, info, work)
        ranking = probe.ranking()
        names = [r["node"] for r in ranking]
        report["ranking"] = ranking[:RANKING_SHOWN]
        budget = max(1, int(len(ranking) * BUDGET))
        report["budget"] = budget
        base = list(spec.keep_fp32_layers)
        # The search runs on the probe (graph edits, no quantizing); the set it finds is then quantized for real.
        kept, after = _search(names, budget, probe, [])
        if kept is not None:
            after = judge([*base, *kept])
        else:  # the probe found nothing: the whole budget, quantized for real, says whether that holds
            after = judge([*base, *names[:budget]])
            kept = names[:budget] if after["pass"] else None
        if kept is not None and not after["pass"]:  # the estimate was too kind: search with real quantization
            kept, after = _search(names, budget, judge, base)
        passed = kept is not None
        report.update(needed=True, passed=passed, kept=kept or [], after=after, evaluations=judge.calls,
                      probe_evaluations=len(ranking) + probe.calls, seconds=round(time.perf_counter() - started, 2))
        if not passed:
            report["note"] = (f"no set of up to {budget} of the {len(ranking)} quantized layers kept in float passes "
                              f"the int8 gate (best cosine {after['cosine']:.4f} against fp32): build fp16 for this "
                              "model, or give more representative calibration samples")
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _search(ranking: list[str], budget: int, judge, base: list[str]) -> tuple[list[str] | None, dict]:
    """Grow the kept set along the ranking (1, 2, 4, ... then the whole budget), then drop what is not needed."""
    sizes, k = [], 1
    while k < budget:
        sizes.append(k)
        k *= 2
    sizes.append(budget)
    best: dict = {}
    found: list[str] | None = None
    for size in sizes:
        figure = judge([*base, *ranking[:size]])
        if not best or figure["cosine"] > best["cosine"]:
            best = figure
        if figure["pass"]:
            found, best = ranking[:size], figure
            break
    if found is None:
        return None, best
    for name in list(reversed(found))[:TRIM_TRIES]:  # least sensitive first
        if len(found) == 1:
            break
        trial = [n for n in found if n != name]
        figure = judge([*base, *trial])
        if figure["pass"]:
            found, best = trial, figure
    return found, best


class _Judge:
    """The CPU int8 artifact with a given set of layers kept in float, against fp32 on the calibration batches."""

    def __init__(self, float_model: Path, samples, spec: BuildSpec, info: ModelInfo, work: Path, make_runner,
                 recipe: str):
        self.float_model, self.samples, self.spec, self.work, self.recipe = float_model, samples, spec, work, recipe
        self.make_runner, self.calls = make_runner, 0
        self.backend = get_backend(Backend.ONNXRUNTIME)
        self.target = Target.parse(f"onnxruntime/cpu-{self.backend.host_platform()}")
        self.feeds = calibration_feeds(samples, info)
        self.limits = spec.accuracy.limits(Precision.INT8.value)
        fp32 = self._built(float_model, Precision.FP32, "fp32")
        runner = make_runner(fp32)
        try:
            self.reference = [runner.infer(feed) for feed in self.feeds]
        finally:
            runner.close()

    def _built(self, model: Path, precision: Precision, name: str) -> Path:
        out = self.work / "artifacts" / f"{name}.onnx"
        out.parent.mkdir(exist_ok=True)
        self.backend.build(model, self.spec.model_copy(update={"precision": precision}), self.target, out,
                           BuildLog(), None)
        return out

    def __call__(self, keep: list[str]) -> dict[str, Any]:
        self.calls += 1
        model = self.work / f"try-{self.calls}" / "model.int8.onnx"
        model.parent.mkdir()
        quantize_qdq(self.float_model, self.samples, model, method=self.spec.calibration.method.value,
                     calibration_batch=self.spec.calibration.batch, family="onnxruntime", scratch=self.work,
                     recipe=self.recipe, keep_fp32_layers=sorted(set(keep)), keep_fp32_ops=self.spec.keep_fp32_ops)
        runner = self.make_runner(self._built(model, Precision.INT8, f"try-{self.calls}"))
        try:
            return {**gate_figure(runner, self.feeds, self.reference, self.limits), "kept": len(set(keep))}
        finally:
            runner.close()


def _qdq_format():
    from onnxruntime.quantization import QuantFormat

    return QuantFormat.QDQ


def _qdq_pairs(graph: onnx.GraphProto) -> list[tuple[str, str]]:
    """(float tensor before QuantizeLinear, float tensor after its DequantizeLinear) for each activation pair."""
    quantized = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    return [(quantized[n.input[0]], n.output[0]) for n in graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in quantized]
