"""An int8 ONNX Runtime artifact timed against its fp32 sibling on the same worker, in the same run, interleaved.

The fp32 sibling is the artifact the ONNX Runtime backend builds from the source model with the same spec at
fp32 (built here on the fly, in seconds). Both are run by the benchmark stage's own runner, alternating in
rounds, so that whatever else the machine is doing falls on both alike. The ratio is stored on each of the
int8 engine's benchmark rows as ``stats["vs_fp32"]``; an int8 artifact that is not faster says so there, with
the figure (``faster: false`` and a ``note``). Called from worker/measure/evaluate.py.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.core.domain import Backend
from enginefarm.core.spec import BuildSpec, Precision
from enginefarm.measure.ort_runner import has_qdq
from worker.backends import BuildLog, ort_artifact
from worker.cleanup import prepared_model

# Rounds of int8 then fp32 (then fp32 then int8: the order alternates); each block runs for about this long.
ROUNDS = 8
_BLOCK_S = 0.1
# Untimed pause before each block. An ONNX Runtime session's pool threads keep spinning for a while after its last
# call; without the pause they take the cores from the next block's session (docs/int8.md).
SETTLE_S = 0.1
# Below this int8/fp32 speed-up an int8 artifact counts as not faster (timing noise on a busy CPU is a few %).
FASTER_THAN = 1.0


def applies(backend: str, spec: BuildSpec) -> bool:
    """Whether an engine gets the comparison: an int8 artifact of ONNX Runtime."""
    return backend == Backend.ONNXRUNTIME.value and spec.precision is Precision.INT8


def fp32_sibling(reference_model: Path, spec: BuildSpec, work: Path) -> Path:
    """Build the fp32 artifact of the source model with the ONNX Runtime backend, as a build task would."""
    fp32 = spec.model_copy(update={"precision": Precision.FP32})
    return ort_artifact(prepared_model(reference_model, fp32, work, BuildLog()), fp32, work / "fp32.onnx")


def interleaved_all(runs: list, rounds: int = ROUNDS, block_s: float = _BLOCK_S) -> list[list[float]]:
    """Per-call milliseconds of each of ``runs``, timed in blocks taken in turn, the order reversed every other
    round so that none always follows the same one; one warm-up call each."""
    return [[ms for block in blocks for ms in block] for blocks in interleaved_rounds(runs, rounds, block_s)]


def interleaved_rounds(
    runs: list, rounds: int = ROUNDS, block_s: float = _BLOCK_S, settle_s: float = SETTLE_S
) -> list[list[list[float]]]:
    """``interleaved_all``'s timings kept by round: for each run, one list of per-call milliseconds per round. The
    runs of one round ran next to each other in time, so per-round ratios pair them under the same load. Each block
    starts ``settle_s`` after the one before ended (``SETTLE_S``)."""
    for run in runs:
        run()
    times: list[list[list[float]]] = [[] for _ in runs]
    for r in range(rounds):
        order = list(zip(runs, times))
        for run, into in order if r % 2 == 0 else order[::-1]:
            block: list[float] = []
            time.sleep(settle_s)
            begin = time.perf_counter()
            while True:
                t = time.perf_counter()
                run()
                block.append((time.perf_counter() - t) * 1e3)
                if time.perf_counter() - begin >= block_s:
                    break
            into.append(block)
    return times


def verdict(int8_ms: list[float], fp32_ms: list[float], rounds: int = ROUNDS) -> dict[str, Any]:
    """The figure stored on the int8 engine's benchmark: both medians, the speed-up, and whether it is faster."""
    int8, fp32 = statistics.median(int8_ms), statistics.median(fp32_ms)
    speedup = fp32 / int8 if int8 > 0 else float("inf")
    out = {
        "fp32_median_ms": round(fp32, 4),
        "int8_median_ms": round(int8, 4),
        "speedup": round(speedup, 3),
        "faster": speedup > FASTER_THAN,
        "int8_calls": len(int8_ms),
        "fp32_calls": len(fp32_ms),
        "method": f"interleaved, {rounds} rounds, same runner and threads, fp32 built from the source model",
    }
    if not out["faster"]:
        out["note"] = f"int8 is not faster than fp32 here: {int8:.2f} ms against {fp32:.2f} ms ({speedup:.2f}x)"
    return out


def compare(
    runner,
    make_runner,
    reference_model: Path,
    spec: BuildSpec,
    inputs_at: Callable[[Any], dict[str, np.ndarray]],
    shape_results: list,
    reraise: tuple[type[BaseException], ...] = (),
) -> list[str]:
    """Time the int8 ``runner`` against its fp32 sibling at every measured shape and put ``vs_fp32`` on each
    shape's stats; returns the notes of shapes where int8 is not faster. ``make_runner(path)`` opens the fp32
    artifact the way the stage opens an engine; ``inputs_at(shape)``: the stage's inputs at a shape; ``reraise``:
    exceptions that must end the stage (time limits)."""
    if not shape_results:
        return []
    if has_qdq(reference_model):
        for result in shape_results:
            result.stats["vs_fp32"] = {"skipped": "the uploaded model holds Q/DQ itself: it has no fp32 sibling"}
        return []
    notes = []
    try:
        with tempfile.TemporaryDirectory(prefix="fp32-sibling-") as work:
            fp32_runner = make_runner(fp32_sibling(reference_model, spec, Path(work)))
            try:
                for result in shape_results:
                    inputs = inputs_at(result.shape)
                    runs = [lambda: runner.infer(inputs), lambda: fp32_runner.infer(inputs)]  # noqa: B023 - called in this iteration
                    int8_ms, fp32_ms = interleaved_all(runs)
                    result.stats["vs_fp32"] = figure = verdict(int8_ms, fp32_ms)
                    if "note" in figure:
                        notes.append(f"{result.shape.key}: {figure['note']}")
            finally:
                fp32_runner.close()
    except reraise:
        raise
    except Exception as exc:  # noqa: BLE001 - the figure is extra: its failure is recorded, the benchmark stands
        for result in shape_results:
            result.stats["vs_fp32"] = {"error": f"the fp32 sibling did not build or run: {type(exc).__name__}: {exc}"}
        return []
    return notes
