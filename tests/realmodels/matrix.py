"""The real-model matrix: every corpus model × target × precision through the farm's own stages, in one process.

A cell runs what a worker runs for one build task, in order: the upload's inspection (``inspect_upload``), the
spec validation the API applies (``validate_spec``), the int8 quantization stage (graph preparation and
``quantize_for_spec`` on the model's samples), the build (``engine_from_model``: preparation, fp16 conversion,
TensorRT-RTX or ONNX Runtime), and, for engines this machine can run (ONNX Runtime on the CPU), the benchmark and
accuracy stage (``evaluate``) against ONNX Runtime FP32 on the original model. TensorRT-RTX engines need an RTX-class
GPU to run, which this machine does not have: their cells record the build only.

``run_matrix`` returns the cells; ``markdown`` renders them for docs/models.md.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.core.domain import ModelInfo, Target, quantize_family
from enginefarm.core.errors import EnginefarmError
from enginefarm.core.spec import BuildSpec, Precision
from enginefarm.core.validation import validate_spec
from enginefarm.graph.inputs import load_samples
from enginefarm.graph.modelfile import inspect_upload
from tests.realmodels import MODELS, RealModel, path, samples
from worker.backends.base import BuildLog
from worker.cleanup import prepared_model
from worker.measure.evaluate import evaluate
from worker.pipeline import engine_from_model

TARGETS = (
    "tensorrt-rtx/sm75",
    "tensorrt-rtx/sm86",
    "tensorrt-rtx/sm89",
    "tensorrt-rtx/sm120",
    "onnxruntime/cpu-x86_64",
)
PRECISIONS = ("fp32", "fp16", "int8")
CALIBRATION_SAMPLES = 8
# Short timing: the matrix measures that benchmarks run and what they report, not this shared CPU's speed.
QUICK_BENCH = {"warmup_ms": 20, "duration_s": 0.2, "iterations": 5}


@dataclass
class Cell:
    model: str
    target: str
    precision: str
    outcome: str  # "ok", "refused" (422 before any build) or "failed" (the build or a stage failed)
    reason: str = ""
    build_s: float | None = None
    engine_bytes: int | None = None
    p50_ms: float | None = None
    accuracy: dict[str, Any] | None = None
    check_errors: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.model, self.target, self.precision


@dataclass
class Prepared:
    """What every cell of one model shares: the inspected model, its samples, its int8 model (or why none)."""

    model: RealModel
    path: Path
    info: ModelInfo
    samples: dict[str, np.ndarray]
    int8_path: dict[str, Path] = field(default_factory=dict)  # target family -> its int8 model
    int8_error: dict[str, str] = field(default_factory=dict)  # target family -> why it has none
    int8_candidates: list[dict[str, Any]] = field(default_factory=list)  # the CPU candidates measured, one kept
    ops: int = 0


def spec_for(model: RealModel, precision: str, **checks: Any) -> BuildSpec:
    # Each cell is the precision asked for: no target builds another one instead.
    return BuildSpec(precision=precision, precision_fallback=False, **model.shapes, **model.spec, **checks)


def prepare(name: str, work: Path) -> Prepared:
    model = MODELS[name]
    onnx_path = path(name)
    inspected = inspect_upload(onnx_path, work / f"{name}-inspect")
    buffer = io.BytesIO()
    # A model whose state batches on another axis than its input (Silero's [2, batch, 128]) streams one chunk.
    np.savez(buffer, **samples(name, 1 if model.batch_axes else CALIBRATION_SAMPLES, seed=1))
    loaded = load_samples(buffer.getvalue(), inspected.info)  # as an upload's samples are checked
    ops = sum(inspected.info.op_types.values())
    return Prepared(model, onnx_path, inspected.info, loaded, ops=ops)


def _quantized(prep: Prepared, work: Path, family: str) -> None:
    """The int8 stage once per model and target family, as worker/int8/stage.py runs it."""
    from enginefarm.measure.ort_runner import OrtRunner
    from worker.int8.choice import quantize_for_cpu
    from worker.int8.quantize import quantize_for_spec

    if family in prep.int8_path or family in prep.int8_error:
        return
    spec = spec_for(prep.model, "int8")
    out = work / f"{prep.model.name}.int8.{family}.onnx"
    try:
        float_model = prepared_model(prep.path, spec, work, BuildLog())
        feed = {n: a for n, a in prep.samples.items() if n not in spec.fixed_inputs}
        if family == "onnxruntime":
            (work / "quantize").mkdir(exist_ok=True)
            report = quantize_for_cpu(
                float_model,
                feed,
                out,
                spec,
                prep.info,
                work / "quantize",
                lambda p: OrtRunner(p, spec.benchmark.threads),
                reference_model=prep.path,
            )
            prep.int8_candidates = report.candidates or []
        else:
            quantize_for_spec(float_model, feed, out, spec, family, work / "quantize")
        prep.int8_path[family] = out
    except EnginefarmError as exc:
        prep.int8_error[family] = f"int8 quantization failed: {exc.message}"


def run_cell(prep: Prepared, target_text: str, precision: str, work: Path, evaluate_cpu: bool = True) -> Cell:
    target = Target.parse(target_text)
    name = prep.model.name
    spec = spec_for(prep.model, precision, benchmark=QUICK_BENCH)
    problems = validate_spec(spec, prep.info, [target], has_samples=True)
    if problems:
        return Cell(name, target_text, precision, "refused", "; ".join(p["msg"] for p in problems))
    source = prep.path
    if Precision(precision) is Precision.INT8 and not prep.info.has_qdq:
        family = quantize_family(target.backend.value)
        _quantized(prep, work, family)
        if family not in prep.int8_path:
            return Cell(name, target_text, precision, "failed", prep.int8_error.get(family, ""))
        source = prep.int8_path[family]
    scratch = Path(tempfile.mkdtemp(dir=work, prefix="cell-"))
    try:
        try:
            built = engine_from_model(source, spec, target, None, scratch, BuildLog(limit=400))
        except EnginefarmError as exc:
            return Cell(name, target_text, precision, "failed", exc.message)
        cell = Cell(name, target_text, precision, "ok", build_s=built.seconds, engine_bytes=built.descriptor.size)
        if target.is_gpu or not evaluate_cpu:
            return cell
        result = evaluate(built.path, target.backend.value, spec, prep.info, prep.path, prep.samples)
        if result.benchmarks:
            cell.p50_ms = result.benchmarks[0].stats["e2e"]["median"]
        cell.accuracy = result.accuracy
        cell.check_errors = result.errors
        return cell
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def model_cells(
    name: str, targets: tuple[str, ...], precisions: tuple[str, ...], work: Path
) -> tuple[list[Cell], Prepared]:
    """Every cell of one model, in order, and what they shared (its int8 models are made once, by the first cell
    that needs each). In a folder of its own: two models' stages, run at once, write files of the same names."""
    work = work / name
    work.mkdir(parents=True, exist_ok=True)
    prep = prepare(name, work)
    return [run_cell(prep, t, p, work) for p in precisions for t in targets], prep


def _sent_back(
    name: str, targets: tuple[str, ...], precisions: tuple[str, ...], work: Path
) -> tuple[list[Cell], Prepared]:
    """``model_cells`` in a pool's process: its Prepared without what cannot travel back (the corpus entry, which
    holds its sample generator, is put back by the caller) or need not (the samples)."""
    cells, prep = model_cells(name, targets, precisions, work)
    return cells, replace(prep, model=None, samples={})  # type: ignore[arg-type]


def run_matrix(
    names: list[str] | None = None,
    targets: tuple[str, ...] = TARGETS,
    precisions: tuple[str, ...] = PRECISIONS,
    work: Path | None = None,
    jobs: int | None = None,
) -> tuple[list[Cell], dict[str, Prepared]]:
    """``jobs``: models run at once, each in a process of its own (default: one per core, at most two). A build
    and an evaluation each keep about one core busy."""
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="matrix-")) if own else work
    names = names or list(MODELS)
    jobs = jobs or min(2, os.cpu_count() or 1, len(names))
    try:
        if jobs == 1:
            done = [model_cells(n, targets, precisions, work) for n in names]
        else:
            # Spawned, not forked: the calling process may hold threads (a test session's farm).
            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                n = len(names)
                done = list(pool.map(_sent_back, names, [targets] * n, [precisions] * n, [work] * n))
            for name, (_, prep) in zip(names, done):
                prep.model = MODELS[name]
        return [c for cells, _ in done for c in cells], {p.model.name: p for _, p in done}
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- docs/models.md


def _accuracy_text(acc: dict[str, Any] | None) -> str:
    if not acc:
        return ""
    worst = acc.get("worst", {})
    figures = []
    if "cosine" in worst:
        figures.append(f"cos {float(worst['cosine']):.5f}")
    if "max_abs" in worst:
        figures.append(f"max abs {float(worst['max_abs']):.2g}")
    if "violations" in worst:
        figures.append(f"out-of-tol {float(worst['violations']):.2%}")
    if "agreement" in worst:
        figures.append(f"agree {float(worst['agreement']):.1%}")
    return ("PASS " if acc.get("pass") else "FAIL ") + ", ".join(figures)


def markdown(cells: list[Cell], preps: dict[str, Prepared]) -> str:
    lines = [
        "| model | ops | opset | target | precision | outcome | build s | engine MB | p50 ms (CPU) | accuracy vs ORT fp32 | reason |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        prep = preps[c.model]
        reason = c.reason.replace("|", "\\|").replace("\n", " ")
        if c.check_errors:
            reason = "; ".join(c.check_errors).replace("|", "\\|")
        if c.outcome == "ok" and c.target.startswith("tensorrt"):
            reason = reason or "built; running it needs an RTX-class GPU of this compute capability"
        lines.append(
            "| "
            + " | ".join(
                [
                    c.model,
                    str(prep.ops),
                    str(prep.info.opset),
                    c.target,
                    c.precision,
                    c.outcome,
                    f"{c.build_s:.2f}" if c.build_s is not None else "",
                    f"{c.engine_bytes / 1e6:.1f}" if c.engine_bytes else "",
                    f"{c.p50_ms:.2f}" if c.p50_ms is not None else "",
                    _accuracy_text(c.accuracy),
                    reason,
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def summary(cells: list[Cell]) -> dict[str, int]:
    out = {"cells": len(cells)}
    for c in cells:
        out[c.outcome] = out.get(c.outcome, 0) + 1
    return out


HEADER = """# Real models: the build matrix

Eight networks we did not write, each built for four TensorRT-RTX targets and ONNX Runtime on the CPU, in fp32,
fp16 and int8, through the farm's own stages (tests/realmodels/matrix.py; the test command runs the same matrix in
tests/e2e/realmodels/test_matrix.py and asserts every cell). Regenerate this page with:

    .venv/bin/python -m tests.realmodels.matrix --write docs/models.md

- **Models** (tests/realmodels/__init__.py has the sources and pinned sha256s): PaddleOCR's text-direction
  classifier, DBNet text detector and SVTR recognizer (rapidocr-onnxruntime 1.4.4 wheel; opset 11-12, dims
  named `?`), a YOLOv8n export with dynamic batch/height/width (nudenet 3.4.2 wheel, Ultralytics 8.2.46), BERT
  (BERT-Tiny config) and MobileNetV2 built by `transformers` with random weights and exported by torch, Silero VAD
  as shipped (LSTMs inside an If on the sample rate) and its If-less op18 variant.
- **Build specs**: small profiles (see the corpus) so that the whole matrix runs in about two minutes on two
  cores. The Silero models fix `sr` to 16000 (`fixed_inputs`) with static shapes and `graph_cleanup: onnxslim`,
  which folds their If away.
- **int8** is made from 8 realistic samples per model (text rendered with real fonts for the OCR models, photo crops
  for the vision models, in-vocabulary token ids for BERT, a tone mix for Silero) with the default calibration
  (percentile).
- **Engines this machine runs** (ONNX Runtime on the CPU) are benchmarked and checked against ONNX Runtime FP32 on
  the original model with the same samples. **TensorRT-RTX engines are built for real** but need an RTX-class GPU
  of that compute capability to run; none is available here, so their cells carry no latency or accuracy. For
  fp16, the ONNX Runtime cell of the same row measures the same converted graph; for int8 it measures the model
  quantized for ONNX Runtime (each target family gets its own int8 model, `worker/int8/quantize/recipes.py`).
- **ops** counts nodes including those inside If/Loop bodies.

"""

GATES = """
## Accuracy gates, and the figures that chose them

The gate compares every element, as Polygraphy does: `|engine - ref| <= atol + rtol * |ref|`, with a per-precision
share of elements allowed outside it; cosine and relative L2 are reported beside it. Integer outputs are compared
by agreement (the share of equal elements).

- **fp32** (atol 1e-4, rtol 1e-3, no element outside): every fp32 CPU artifact above matches to about 1e-6. The old
  gate (relative L2 1e-3, cosine 0.99999) failed the PP-OCR detector's fp32 artifact (cosine 0.99997 on a probability
  map that is mostly near zero); the elementwise gate passes it and still fails one element off by 1e-2
  (tests/unit/test_stats.py).
- **fp16** (atol 1e-2, rtol 1e-2, at most 0.5% of elements outside): the PP-OCR detector's fp16 graph puts 0.17% of
  its probability-map elements outside 1e-2 + 1e-2|ref| (max abs 0.075 at text edges, cosine 0.99999); 0.1% would
  fail a conversion that is visibly right. Every other model has no element outside.
- **int8** (cosine >= 0.98, relative L2 <= 0.2, agreement >= 0.9): elementwise limits do not fit a quantized
  network, whose error scales with each tensor's range. The CPU cells run the form the quantize stage keeps: the
  fastest of ONNX Runtime's candidates whose outputs pass on the check's own inputs (every sample at the opt batch,
  against fp32 on the uploaded model). Every corpus model passes: YOLOv8n (0.999), BERT (0.9996), MobileNetV2
  (0.998), the PP-OCR classifier (0.999), detector (0.980) and recognizer (0.992), and Silero (0.9994). Until the
  stage judged its candidates as the check does (2026-12-07), it screened them on two samples at batch 1 and kept
  forms the check then failed: the PP-OCR detector (0.969), the recognizer (0.918) and Silero (0.93). A failed gate
  keeps the engine in the catalog, marked failed.
"""

INT8_VS_FP32 = """
## int8 against fp32 on the CPU

The CPU int8 form is now chosen per model by measurement among several candidates; [int8.md](int8.md) has how, and the figures on a CPU with VNNI and on this one. The table below is the measurement with the operator format alone, before that choice.

    .venv/bin/python bench/models.py --int8-only                       # every model below, about 30 minutes here
    .venv/bin/python bench/models.py --int8-only --models resnet50 convnext

For each model, the farm's own stages in one process: the quantize stage's ONNX Runtime recipe calibrated on 16
samples (one chunk for Silero), the ONNX Runtime build of the int8 and of the fp32 model, and the benchmark
stage's runner timing the two in alternating blocks, 10 rounds (`worker/measure/int8_vs_fp32.py`, the code that stores
`vs_fp32` on every int8 CPU engine's benchmark). Speed-up = fp32 median / int8 median; cosine of the int8 output
against fp32 on an input not used for calibration. ResNet-50 (torchvision's layers), ConvNeXt-Tiny (timm's) and a
GPT-2 style decoder are exported by `tests/realmodels/export_large.py` with random weights.

Machine: AMD EPYC, 2 cores, AVX2 **without VNNI**, shared with other jobs (load average 10-17 during the run), 2
ONNX Runtime threads, onnxruntime 1.32.0. 2026-11-26.

| model | fp32 ms | int8 ms | int8/fp32 speed-up | faster | cosine |
|---|---|---|---|---|---|
| ppocr-cls | 107.83 | 200.75 | 0.54x | no | 0.99992 |
| mobilenet-v2 | 221.80 | 340.25 | 0.65x | no | 0.99638 |
| ppocr-det | 558.98 | 725.84 | 0.77x | no | 0.97861 |
| yolov8n | 881.02 | 934.18 | 0.94x | no | 0.99979 |
| bert | 20.15 | 26.52 | 0.76x | no | 0.99964 |
| ppocr-rec | 519.51 | 643.17 | 0.81x | no | 0.96015 |
| silero-vad | 0.237 | 0.221 | 1.07x | yes (within noise) | 1.00000 |
| silero-vad-op18 | 0.228 | 0.217 | 1.05x | yes (within noise) | 1.00000 |
| resnet50 | 924.04 | 1012.94 | 0.91x | no | 0.99861 |
| convnext | 613.92 | 553.53 | 1.11x | yes | 0.99893 |
| gpt2 | 23.31 | 21.30 | 1.09x | yes | 0.99904 |

The rows come from three runs of the command on the same day (the corpus; ResNet-50 and ConvNeXt; GPT-2 and Silero
after fixing their inputs), partly at the same time; each row's two figures are from one interleaved run. A second
run with `--all-optimizations` gave ResNet-50 0.90x (487 against 541 ms), ConvNeXt 0.86x and the PP-OCR
classifier 0.47x: run to run, a row moves by about 0.2.

**The goal (int8 at least 1.5x faster than fp32 for ResNet-50 and ConvNeXt, and not slower for any model) is not met
on this machine** (nor fully on one with VNNI: [docs/int8.md](int8.md) and the repair table below). Without VNNI, ONNX Runtime's u8s8 integer kernels (`vpmaddubsw`, then widening adds) do about
the work of its fp32 AVX2 kernels per multiply-accumulate, and every int8 model adds requantization between
layers; the CPU backend also runs models with Q/DQ at the basic optimization level on such CPUs (its guard
against saturating fused kernels), which keeps fp32's NCHWc layout and fusions out of the int8 graph's float
parts. With that guard lifted (`bench/models.py --all-optimizations`), ResNet-50 was still 0.90x. So the farm says
so: an int8 CPU engine that measures not faster carries `vs_fp32.faster = false` and a note with the figure on its
benchmark, and the build's quantize report carries the quantize stage's own first look (`reports.onnxruntime.vs_fp32`).

**The format, chosen by measurement** (ResNet-50, batch 1, 1 thread, interleaved against fp32 2048 ms; then the
PP-OCR classifier, 2 threads): at the basic level this CPU gets for quantized models, ONNX Runtime's operator format
(QLinearConv, ...) with per-channel int8 weights in 7 bits (`reduce_range`) and uint8 activations ran 1849 ms
(1.11x) against 2168 ms for QDQ u8s8 (0.94x): **QOperator won by 17%**, and on the PP-OCR classifier by 1.9x (205
against 441 ms; QDQ with `reduce_range` 228 ms). QOperator with uint8 weights ran ResNet-50 in 1599 ms (1.28x) but
took the PP-OCR classifier to cosine 0.55 against fp32, so it is not used. QDQ s8s8 and u8u8 at the full level ran
0.87x and 0.84x. Pre-processing (`quant_pre_process`, symbolic shape inference then ONNX's) runs before every
quantization: it folds constants and gives the quantizer the shapes it needs.

TensorRT targets get their own int8 model (symmetric int8 Q/DQ on the inputs of Conv, ConvTranspose, Gemm and
MatMul with a constant weight; `worker/int8/quantize/recipes.py`). No GPU here runs TensorRT engines, so there is no
int8-against-fp32 figure for them; they build with TensorRT-RTX (the matrix above). NVIDIA Model Optimizer's ONNX
PTQ was not used: nvidia-modelopt 0.47 needs torch, and its `[onnx]` extra pins `onnxruntime-gpu~=1.24.2`,
`cupy-cuda12x` and `onnx~=1.21.0` on Linux x86_64, which would replace the CPU worker's ONNX Runtime 1.32.
"""

INT8_REPAIR = """
## int8 with accuracy repair, on a CPU with VNNI

    python bench/models.py --int8-only --repair --models-dir DIR --models NAME   # one run per model

What issue 31 asks of the corpus: for each model, the quantize stage's repair (`accuracy_repair: true`), the layers
it kept in float, the accuracy before and after, and the CPU latency of fp32, int8 as it would be without the
repair and int8 repaired, the three timed interleaved in one run (`bench/models.py`, part 3; the files and samples
made here with `--save-models`). On a 16-vCPU Intel Xeon with AVX-512 VNNI and AMX (ONNX Runtime 1.32, 16
threads), 2026-11-26. "Cosine" is the int8 gate's (every output against ONNX Runtime fp32 on the model's samples);
latencies are medians at the batch of the model's opt shape.

| model | repair | layers kept | cosine before → after | fp32 ms | int8 unrepaired ms | int8 repaired ms | repaired vs fp32 | search |
|---|---|---|---|---|---|---|---|---|
| silero-vad | passed | 1 (`stft/Add`) | 0.916 → 0.999 | 0.098 (0.121 alone) | 0.066 (1.47x) | 0.064 (0.066 alone) | **1.52x** (1.84x alone, 1.29x in the stage's timing) | 2 checks + 22 probe runs, 0.5 s = 3.6x one check |
| ppocr-rec | passed | 17 (Mul/Add of hard-swish, 4 Conv) | 0.968 → 0.994 | 50.1 (20.6 alone) | 27.5 | 32.1 (21.7 alone) | not faster: 0.95x alone, 0.98x in the stage's timing (the interleaved 1.56x is the disturbed timing below) | 10 checks + 349 probe runs, 278 s = **17.7x** one check |
| ppocr-det | **passed by form**: no set of up to 63 of 255 layers repairs the operator format (best 0.973); the `convolutions` form passes as it is | - | 0.971 → 0.986 | 14.0 | - | 17.2 (`convolutions`) | not faster: 0.81x (0.92x alone): fp32 recommended | 10 checks + 293 probe runs, 229 s = **15.6x** one check |
| ppocr-cls | not needed (0.99999) | - | - | 4.02 | - | 6.83 | 0.59x | 1 check, 2 s |
| yolov8n | not needed (0.9994) | - | - | 9.34 | - | 9.69 | 0.96x | 1 check, 15 s |
| mobilenet-v2 | not needed (0.9976) | - | - | 5.90 | - | 3.53 | **1.67x** | 1 check, 13 s |
| bert | not needed (0.9996) | - | - | 2.01 | - | 2.12 | 0.94x | 1 check, 10 s |

- **Rerun after the repair's changes** (2026-11-27, the same kind of VNNI Xeon, 16 vCPU, ONNX Runtime 1.32, one run
  per row above; the earlier rows are in git history): the probe judges every set of layers through one session
  with a switch per tensor, the real-quantization search starts from the probe's set and trims at most three times,
  and where no set within the budget passes, the other CPU forms are judged as they are
  ([int8.md](int8.md#when-int8-fails-its-gate-repair)).
- **Every int8 cell passes after repair**: Silero VAD and the PP-OCR recognizer by the layers kept, the PP-OCR
  detector by its `convolutions` form (cosine 0.986 on the calibration batches, 0.991 on the held-out input), which
  the repair now names (`form: convolutions`) instead of stopping; that form is not faster than fp32 on this CPU
  (0.81x, 0.92x alone), so the farm records `faster: false` and hands out fp32 to a machine that accepts both. Before
  this change the detector stopped with "no set of up to 63 of the 255 quantized layers ... build fp16".
- **Cost, goal ≤ 20x one check: met** on the three: Silero 3.6x, det 15.6x, rec **17.7x** (was 23.1x: 15 real checks
  → 10). The probe's switch session did not make rec's 349 probe runs cheaper (rec's runs, not its sessions, are the
  cost: 71 s against 72 s for the ranking on the 2-core EPYC); it did on small models (PP-OCR cls: 6.2 → 2.0 s).
- **Speed kept** (goal: repaired int8 ≥ 1.3x fp32 where int8 without repair was faster; only Silero qualifies, its
  unrepaired int8 1.47x): Silero's repaired artifact 1.52x interleaved, 1.84x timed alone and 1.29x in the int8
  stage's own candidate timing in this run; 1.26x, 1.30x and 1.28x in the runs of 2026-11-26. A 0.1 ms model, where
  the figure moves by 0.05 to 0.3 run to run: at the line, above it in most timings. **PP-OCR rec's 1.90x is withdrawn.** A second run on the same kind of machine gave the
  same picture (fp32 59.4 ms, repaired 26.8 ms, 2.22x), but only in this interleaved timing after the repair: in
  that machine's other timings fp32 takes 22-23 ms and the kept (`dynamic`) form 21.5-23 ms: 0.94x in the quantize
  stage's own candidate timing, 1.04x with each session timed alone, 0.97x interleaved without the repair before
  it, on generated inputs and on the samples alike. The slow fp32 is a disturbance of that one timing whose cause is
  not found; bench/models.py now times the two alone as well and marks a row whose ratios disagree by more than a
  fifth. So rec's int8, repaired or not, is about as fast as fp32 on this CPU, not faster. **The cause, found 2026-11-27**: the previous session's ONNX Runtime pool threads, still spinning when the next block began; every block now starts after an untimed pause of 0.1 s, and rec's row then agrees with its alone timing (fp32 22.0 ms interleaved, 20.3 ms alone; repaired int8 0.71x and 0.67x; [int8.md](int8.md#figures)). Four models have a CPU int8 artifact that is not faster than fp32 here (cls, det, yolov8n, BERT at batch
  4); the farm records that on the engine (`vs_fp32.faster = false`) and ranks fp32 first.
- **Cost, before this change** (2026-11-26): the search is dominated by probe runs (one ONNX Runtime session per tensor put back in float) and by
  the real checks (a quantization and a judgement each). The repair now reports its cost in checks of the model
  (`cost_in_checks`: its seconds over the median of its own real checks, `check_seconds`). Rerun on the same kind
  of VNNI Xeon, 2026-11-26 (`bench/models.py --int8-only --repair`): **Silero 2.1x** one check (4.6 s, checks of
  2.1 s), **PP-OCR det 13.4x** (211 s, checks of 15.8 s; the same honest stop), **PP-OCR rec 23.1x** (317 s,
  15 checks of 13.7 s and 349 probe runs). The goal (≤ 20x one check) holds for Silero and det and **not for rec**,
  whose 349 probe runs (one per int8 tensor of 255 layers) cost as much as eight checks.
- **Rerun's speed figures**: Silero's repaired int8 1.30x fp32 interleaved and 1.28x with each timed alone (the two
  agree). After rec's and det's repairs the interleaved timing was disturbed again (rec fp32 61.0 ms interleaved,
  20.4 ms alone; det's kept int8 18.4 ms interleaved, 12.9 ms alone), and the new cross-check marked both rows
  "disagrees"; timed alone, rec's repaired int8 is 0.96x fp32 and det's `convolutions` form 1.01x. A third det run
  with the process's threads counted and a garbage collection between two interleaved timings showed no disturbance
  at all (0.93x interleaved, 0.96x alone, 47 threads, the same before and after collecting): it is intermittent (3 of
  5 repair runs), not leaked sessions; the likelier cause is the shared VM's CPUs, and the cross-check is the guard.
"""
BEFORE_AFTER = """
## The failures that started this, and what happens now

| seen before | now |
|---|---|
| YOLOv8 fp16 failed on every TensorRT-RTX target: `Input 0's element type (float) differs from input 1's element type (half)` at a `Range`, message cut (`It is no`) | shape and index arithmetic stays fp32 (`worker/rewrite/fp16/`); YOLOv8 fp16 builds on sm75/86/89/120 and its CPU fp16 artifact matches fp32 (cosine 1.00000). A mixed-type failure would now name the ONNX node and point to `keep_fp32_ops`/`keep_fp32_layers`; only complete sentences of the builder reach the message |
| int8 on an opset-12 model: `Unrecognized attribute: axis for operator DequantizeLinear` | the quantizer raises the opset to 13 and checks the outputs match; PP-OCR det and rec int8 build on sm86/89/120 |
| BERT and YOLOv8 int8 on TensorRT-RTX: `Quantized constant (...) is only allowed before DQ` | ONNX Runtime's `quantize_static` with TensorRT's options (symmetric int8, Q/DQ on the inputs of weighted ops only, per-channel weights, float bias, a float copy of a weight shared with a Gather); both build |
| benchmarks crashed on BERT's integer inputs (`idx=6 must be within [-2,1]`) | integer inputs that index a table stay inside it (read from the graph at upload); uploaded samples are used for timing; `value_ranges` for the rest |
| a failed benchmark skipped the accuracy check and the build read as success | each shape's failure is recorded, the accuracy check still runs, the check ends `failed` with the reason, and the build's `summary` counts it |
| the OCR detector's fp32 CPU artifact failed with cosine 0.99997, mean abs 8e-10 | elementwise gate (atol+rtol); it passes |
| two inputs sharing `batch` accepted with different values; two `?` dims treated as one | a 422 naming the shared dim and the values; `?` dims are distinct to validation and renamed apart before TensorRT parses (PP-OCR cls builds) |
| fp32 BERT for sm75 accepted, then `FP32 GEMM is not supported` in the builder | refused before building (fp32 and int8), with the source and "build fp16 for sm75"; fp16 builds there |
| an `If` gave a raw `tScope.getType() != ScopeType::kUNDEFINED` | the message names the If node and says to fix the deciding input (`fixed_inputs`), give static shapes and use `graph_cleanup: onnxslim`; done that way, Silero VAD builds on every target |
| the build log only through REST | `enginefarm logs BUILD [--target T]` |
"""


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="run the real-model matrix and print or write it")
    parser.add_argument("--write", type=Path, help="write docs/models.md here")
    parser.add_argument("--models", help="comma-separated corpus names (default: all)")
    args = parser.parse_args()
    started = time.perf_counter()
    cells, preps = run_matrix(args.models.split(",") if args.models else None)
    counts = summary(cells)
    ok = counts.get("ok", 0)
    tally = (
        f"**{ok} of {counts['cells']} cells succeed ({ok / counts['cells']:.0%})**; "
        f"{counts.get('refused', 0)} are refused before building and {counts.get('failed', 0)} failed, each with "
        f"its reason. The run took {time.perf_counter() - started:.0f} s.\n\n"
    )
    text = HEADER + tally + markdown(cells, preps) + "\n" + GATES + INT8_VS_FP32 + INT8_REPAIR + BEFORE_AFTER
    if args.write:
        args.write.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
