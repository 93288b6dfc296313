"""The session sweep of an ``onnxruntime/cuda-smXY`` artifact: which CUDA provider options run it fastest here.

Each of ``SESSION_CHOICES`` (the defaults, NHWC convolutions, a CUDA graph, both) gets a session of its own and is
timed by the farm's CUDA timing at the opt shape, by the spec's trtexec rules, as the benchmark stage times the
artifact. The choices are tried fastest first against the accuracy check's inputs, judged as the stage's check
judges (``check.verdict``: an fp32 miss that TF32 explains passes), and the first whose outputs pass is kept. NHWC
runs other kernels and may move the numbers; a graph replays the same kernels (its replay is also compared with a
plain run, ``OrtCudaRunner._replay_difference``). The benchmark stage then measures every shape and runs the check
with the kept choice, and the engine carries its options (``EngineDescriptor.run_options``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.core.errors import EnginefarmError
from enginefarm.core.spec import BuildSpec
from enginefarm.measure import check
from enginefarm.measure.check import Reference
from enginefarm.measure.ort_cuda_runner import SESSION_CHOICES, OrtCudaRunner, SessionChoice


@dataclass
class Sweep:
    """What the sweep kept and what it measured of each choice (the report's runner-ups)."""

    chosen: SessionChoice = SessionChoice()
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0  # what the sweep cost: every session's creation, timing and check

    def record(self) -> dict[str, Any]:
        """As the opt shape's benchmark keeps it (``stats["sessions"]``)."""
        return {
            "chosen": self.chosen.name,
            "run_options": self.chosen.provider_options(),
            "choices": self.rows,
            "seconds": round(self.seconds, 2),
        }


def sweep(
    engine_path: Path,
    spec: BuildSpec,
    inputs: dict[str, np.ndarray],
    reference: Reference | None,
    reraise: tuple[type[BaseException], ...] = (),
) -> Sweep:
    """Time each choice at ``inputs`` (the opt shape's), then keep the fastest whose outputs pass the check on
    ``reference`` (None: no check asked for; the fastest that ran is kept)."""
    started = time.monotonic()
    out = _sweep(engine_path, spec, inputs, reference, reraise)
    out.seconds = time.monotonic() - started
    return out


def _sweep(
    engine_path: Path,
    spec: BuildSpec,
    inputs: dict[str, np.ndarray],
    reference: Reference | None,
    reraise: tuple[type[BaseException], ...],
) -> Sweep:
    out = Sweep()
    timed: list[tuple[float, SessionChoice, dict[str, Any]]] = []
    for choice in SESSION_CHOICES:
        row: dict[str, Any] = {"session": choice.name, "provider_options": choice.provider_options()}
        out.rows.append(row)
        try:
            runner = OrtCudaRunner(engine_path, tf32=spec.tf32, choice=choice)
        except reraise:
            raise
        except EnginefarmError as exc:
            row["error"] = exc.message
            continue
        try:
            m = runner.benchmark(inputs, spec.benchmark)
        except reraise:
            raise
        except EnginefarmError as exc:
            row["error"] = exc.message
            continue
        finally:
            runner.close()
        summary = m.summary(1)
        row.update(
            median_ms=summary["e2e"]["median"],
            p99_ms=summary["e2e"].get("p99"),
            compute_median_ms=(summary.get("compute") or {}).get("median"),
        )
        if "replay_max_abs_diff" in m.extra:
            row["replay_max_abs_diff"] = m.extra["replay_max_abs_diff"]
        timed.append((row["median_ms"], choice, row))
    limits = spec.accuracy.limits(spec.precision.value)
    for _ms, choice, row in sorted(timed, key=lambda t: t[0]):
        if reference is None or choice.plain() == SessionChoice():
            # The defaults' kernels: the benchmark stage's own check judges them.
            out.chosen = choice
            return out
        runner = OrtCudaRunner(engine_path, tf32=spec.tf32, choice=choice.plain())
        try:  # as the stage's check judges: an fp32 miss that TF32 explains passes (check.tf32_verdict)
            judged = check.verdict(runner, reference, limits, spec.precision.value)
        except reraise:
            raise
        except (EnginefarmError, ValueError) as exc:
            row["error"] = getattr(exc, "message", None) or str(exc)
            continue
        finally:
            runner.close()
        row["accuracy_pass"] = bool(judged["pass"])
        if judged["pass"]:
            out.chosen = choice
            return out
    return out
