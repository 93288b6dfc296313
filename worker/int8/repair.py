"""Accuracy repair of int8: which layers break the gate, measured, and the smallest set kept in float that passes.

1. **Sensitivity.** The model is quantized once in Q/DQ form with the CPU recipe's settings; then, for each
   quantized activation, that tensor alone is put back in float (its readers take the tensor before its
   QuantizeLinear) and the output's cosine against fp32 is measured on the calibration batches (ONNX Runtime on the
   CPU, optimizations off, so every other pair stays as written). A tensor's figure goes to the layer whose
   quantization put the pair there: its producer where the operator format quantizes that op (an Add's output),
   else the quantized layers reading it. The most improving first is the ranking, by ONNX node name.
2. **Search** (worker/repair.py) on the calibration batches, judged on the same Q/DQ model with the layers' tensors
   put back in float (cheap: no quantizing); the set it finds is then quantized for real (``keep_fp32_layers``) and
   judged as the artifact, and only if that fails does the search run again with real quantization at each step.
3. **An honest stop.** If the budget passes nothing, the report says so with the figures and recommends fp16.

The same samples and spec give the same ranking and the same kept set: nothing here is timed. Called by the
quantize stage (worker/int8/stage.py) when the spec asks ``accuracy_repair``; the kept set then applies to
every target family's int8 model.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat

from enginefarm.core.domain import ModelInfo
from enginefarm.core.spec import BuildSpec, Precision
from worker.backends import ort_artifact
from worker.int8.choice import gate_figure, gate_of, screening_inputs
from worker.int8.quantize import CPU_CANDIDATES, QuantizeReport, cpu_candidates, quantize_for_spec
from worker.int8.quantize.qdq import qdq_pairs
from worker.measure.evaluate import accuracy_inputs
from worker.repair import (
    RANKING_SHOWN,
    Timed,
    budget_of,
    groups_covering,
    not_needed,
    search,
    within,
)

# With real quantization at each step, at most this many single-group drops are tried once a set passes.
REAL_TRIMS = 3


def sensitivity(
    float_model: Path, samples: dict[str, np.ndarray], spec: BuildSpec, info: ModelInfo, work: Path
) -> list[dict[str, Any]]:
    """Each quantized layer's share of the error, worst first: the output's cosine against fp32 with that layer's
    int8 tensor alone put back in float (``cosine_alone_float``), against all of them int8 (``cosine_int8``)."""
    return _Probe(float_model, samples, spec, info, work).ranking()


class _Probe:
    """The model quantized once in Q/DQ form, where putting a layer back in float is a switch: each reader of a
    dequantized activation takes ``Where(switch, tensor before its QuantizeLinear, tensor after its
    DequantizeLinear)``, the switches one boolean input. One session judges every set of layers at the output
    against fp32, without quantizing again or building a session per set."""

    def __init__(self, float_model: Path, samples: dict[str, np.ndarray], spec: BuildSpec, info: ModelInfo, work: Path):
        import onnxruntime as ort

        qdq = work / "sensitivity.onnx"
        recipe = replace(CPU_CANDIDATES["operator"], quant_format=QuantFormat.QDQ, name="sensitivity")
        quantize_for_spec(float_model, samples, qdq, spec, "onnxruntime", work, recipe=recipe)
        model = onnx.load(str(qdq))
        self.reference = screening_inputs(float_model, samples, info)
        self.limits = spec.accuracy.limits(Precision.INT8.value)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # pairs as written
        from onnxruntime.quantization.registry import QLinearOpsRegistry

        graph = model.graph
        self.quantizable = {n.name for n in graph.node if n.op_type in QLinearOpsRegistry and n.name}
        produced = {o: n.name for n in graph.node for o in n.output}
        pairs = qdq_pairs(graph)
        producer = {before: produced.get(before, "") for before, _ in pairs}  # "": a graph input or initializer
        reading: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for n in graph.node:
            for i, x in enumerate(n.input):
                reading.setdefault(x, []).append((n, i))
        readers = {after: reading.get(after, []) for _, after in pairs}
        # The layers to exclude from quantization for a tensor to stay float: its producer where that is
        # quantized, and every quantized layer reading it (each quantizes its own inputs).
        self.layers_of = {
            before: sorted(
                {
                    *([producer[before]] if producer[before] in self.quantizable else []),
                    *(n.name for n, _ in readers[after] if n.name in self.quantizable),
                }
            )
            for before, after in pairs
        }
        # One switch per reader of a pair, with the rule that flips it: the reader is excluded itself, or it is not
        # quantized and the pair's producer is (an excluded layer's float output reaches it).
        self.edges = [
            (node.name, node.name not in self.quantizable, producer[before])
            for before, after in pairs
            for node, _ in readers[after]
        ]
        _add_switches(graph, [(node, slot, before) for before, after in pairs for node, slot in readers[after]])
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=CPU)
        self.base = self._judged(set())
        self.calls = 0

    def _judged(self, layers: set[str]) -> dict[str, Any]:
        """The gate figure with these layers excluded from quantization, as the quantizer excludes them: each
        reads its inputs in float; a layer that is not quantized itself reads the float output of an excluded one."""
        switches = np.array(
            [name in layers or (plain and made_by in layers) for name, plain, made_by in self.edges], dtype=bool
        )
        feeds = [{**feed, SWITCHES: switches} for feed in self.reference.feeds]
        return gate_of(_outputs(self.session, feeds), self.reference, self.limits)

    def ranking(self) -> list[dict[str, Any]]:
        """Each int8 tensor, by the output's cosine with it alone in float (its layers excluded), best first."""
        rows = []
        for before, layers in self.layers_of.items():
            if layers:
                rows.append((self._judged(set(layers))["cosine"], before, layers))
        rows.sort(key=lambda r: (-r[0], len(r[2]), r[1]))  # on a tie, the fewer layers
        return [
            {"tensor": t, "layers": layers, "cosine_alone_float": round(c, 6), "cosine_int8": self.base["cosine"]}
            for c, t, layers in rows
        ]

    def __call__(self, layers: list[str]) -> dict[str, Any]:
        """The gate figure with these layers in float (their weights stay int8 here: an estimate)."""
        self.calls += 1
        return self._judged(set(layers))


def repair(
    float_model: Path,
    samples: dict[str, np.ndarray],
    spec: BuildSpec,
    info: ModelInfo,
    scratch: Path,
    make_runner,
    recipe: str = "operator",
    unrepaired_to: Path | None = None,
    reference_model: Path | None = None,
) -> dict[str, Any]:
    """Find the layers to keep in float so that the CPU int8 artifact (``recipe``) passes the gate; returns the
    repair report (``kept``: the node names, empty when nothing was needed or nothing passed; ``passed``).
    ``unrepaired_to``: a folder where, when the repair keeps layers, the int8 model judged ``before`` (the failed
    original, without them) is left as ``model.int8.onnx``, with its quantize report in ``report.json``."""
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="int8-repair-", dir=scratch))
    try:
        judge = Timed(_Judge(float_model, samples, spec, info, work, make_runner, recipe, reference_model))
        before = judge(spec.keep_fp32_layers)
        report: dict[str, Any] = {
            "recipe": recipe,
            "before": before,
            "method": "each int8 tensor alone put back in float, measured at the output; then the layers of the top "
            "1, 2, 4, ... tensors kept in float until the gate passes, then unneeded ones dropped",
        }
        if before["pass"]:
            return not_needed(report, before, judge, started)
        probe = _Probe(float_model, samples, spec, info, work)
        ranking = probe.ranking()
        groups = [r["layers"] for r in ranking]
        report["ranking"] = ranking[:RANKING_SHOWN]
        report["ranked_on"] = probe.reference.origin  # before and after are judged as the engine's check judges
        budget = budget_of(len(probe.quantizable))
        report["budget"] = budget
        base = list(spec.keep_fp32_layers)
        # The search runs on the probe (graph edits, no quantizing); the set it finds is then quantized for real.
        kept, after = search(groups, budget, probe, [])
        if kept is not None:
            after = judge([*base, *kept])
        else:  # the probe found nothing: the whole budget, quantized for real, says whether that holds
            whole = within(groups, budget)
            after = judge([*base, *whole])
            kept = whole if after["pass"] else None
        if kept is not None and not after["pass"]:
            # The estimate was too kind: search with real quantization, from the probe's set on, trimming less.
            start = groups_covering(groups, budget, kept)
            kept, after = search(groups, budget, judge, base, start=start, trims=REAL_TRIMS)
        passed = kept is not None
        within_budget = f"no set of up to {budget} of the {len(probe.quantizable)} quantized layers kept in float "
        forms: dict[str, dict[str, Any]] = {}
        if not passed:  # the CPU forms that keep whole kinds of layer in float, each judged as it is
            forms = _other_forms(judge, float_model, recipe, base)
        form = next((name for name, figure in forms.items() if figure["pass"]), None)
        report.update(
            needed=True,
            passed=passed or form is not None,
            kept=kept or [],
            after=forms[form] if form else after,
            probe_evaluations=len(ranking) + probe.calls,
            **judge.cost(started),
        )
        if forms:
            report["forms"] = forms
        if passed and kept and unrepaired_to is not None:
            judge.keep_first(unrepaired_to)
        if form:
            report["form"] = form
            report["note"] = (
                f"{within_budget}passes the int8 gate with the {recipe} form (best cosine {after['cosine']:.4f} "
                f"against fp32); the {form} form passes as it is (cosine {forms[form]['cosine']:.4f}): "
                f"{CPU_CANDIDATES[form].label}"
            )
        elif not passed:
            tried = "".join(f"; the {name} form {figure['cosine']:.4f}" for name, figure in forms.items())
            report["note"] = (
                f"{within_budget}passes the int8 gate (best cosine {after['cosine']:.4f} against fp32{tried}): "
                "build fp16 for this model, or give more representative calibration samples"
            )
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _other_forms(judge, float_model: Path, recipe: str, base: list[str]) -> dict[str, dict[str, Any]]:
    """Each other CPU form that applies to the model (worker/int8/quantize/recipes.py: convolutions alone, dense
    convolutions alone, dynamic matrix products) judged as it is, in order, until one passes."""
    forms: dict[str, dict[str, Any]] = {}
    for name in cpu_candidates(float_model):
        if name != recipe:
            forms[name] = judge(base, recipe=name)
            if forms[name]["pass"]:
                break
    return forms


class _Judge:
    """The CPU int8 artifact with a given set of layers kept in float, judged as the engine's accuracy check will
    judge it: its inputs, ONNX Runtime fp32 on ``reference_model`` (the uploaded model; default ``float_model``,
    which must then take every input the spec fixes), its code."""

    def __init__(
        self,
        float_model: Path,
        samples,
        spec: BuildSpec,
        info: ModelInfo,
        work: Path,
        make_runner,
        recipe: str,
        reference_model: Path | None = None,
    ):
        self.float_model, self.samples, self.spec, self.work, self.recipe = float_model, samples, spec, work, recipe
        self.make_runner, self.calls = make_runner, 0
        self.first: tuple[Path, QuantizeReport] | None = None  # the model of the first call, and its report
        self.reference = accuracy_inputs(reference_model or float_model, spec, info, samples)
        self.limits = spec.accuracy.limits(Precision.INT8.value)

    def __call__(self, keep: list[str], recipe: str | None = None) -> dict[str, Any]:
        """The gate figure of the CPU artifact with ``keep`` in float, quantized with ``recipe`` (else the
        repair's)."""
        self.calls += 1
        model = self.work / f"try-{self.calls}" / "model.int8.onnx"
        model.parent.mkdir()
        quantized = quantize_for_spec(
            self.float_model,
            self.samples,
            model,
            self.spec,
            "onnxruntime",
            self.work,
            recipe or self.recipe,
            sorted(set(keep)),
        )
        self.first = self.first or (model, quantized)
        artifact = self.work / "artifacts" / f"try-{self.calls}.onnx"
        runner = self.make_runner(ort_artifact(model, self.spec, artifact, Precision.INT8))
        try:
            return {**gate_figure(runner, self.reference, self.limits), "kept": len(set(keep))}
        finally:
            runner.close()

    def keep_first(self, folder: Path) -> None:
        """Copy the first call's model (and its data file, whose name the model refers to) into ``folder``."""
        assert self.first is not None
        model, quantized = self.first
        folder.mkdir(parents=True, exist_ok=True)
        for f in (model, model.with_name(model.name + ".data")):
            if f.exists():
                shutil.copyfile(f, folder / f.name)
        (folder / "report.json").write_text(json.dumps(quantized.to_dict()))


SWITCHES = "enginefarm_repair_switches"
CPU = ["CPUExecutionProvider"]


def _outputs(session, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed))) for feed in feeds]


def _add_switches(graph: onnx.GraphProto, edges: list[tuple[onnx.NodeProto, int, str]]) -> None:
    """Make each (reader, input slot, float tensor) edge read ``Where(switches[k], float tensor, what it read)``,
    ``switches`` a boolean vector input of the graph, one entry per edge in this order."""
    graph.input.append(helper.make_tensor_value_info(SWITCHES, TensorProto.BOOL, [len(edges)]))
    for k, (node, slot, before) in enumerate(edges):
        index, switch, chosen = f"{SWITCHES}_{k}_at", f"{SWITCHES}_{k}", f"{SWITCHES}_{k}_out"
        graph.initializer.append(numpy_helper.from_array(np.array(k, dtype=np.int64), index))
        graph.node.append(helper.make_node("Gather", [SWITCHES, index], [switch]))
        graph.node.append(helper.make_node("Where", [switch, before, node.input[slot]], [chosen]))
        node.input[slot] = chosen
