"""Latency statistics the way trtexec reports them, and the measurement loop that collects the samples.

trtexec (samples/common/sampleReporting.cpp) sorts the samples and reports min, max, mean, median
(the mean of the two middle samples for an even count) and percentiles by exclusion: the p-th
percentile of n sorted samples is the sample at index ``max(n - 1 - floor((1 - p/100) * n), 0)``.
We use the same definitions, so our numbers and trtexec's read alike.

The loop follows trtexec's defaults: a time-based warm-up (200 ms), then iterations until both a
minimum duration (3 s) and a minimum count (10) are reached. Throughput is iterations divided by the
wall time of the measured phase.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

# The phases of one inference: host→device copy, compute, device→host copy, and all of it end to end.
PHASES = ("e2e", "compute", "h2d", "d2h")


def percentile(sorted_samples: Sequence[float], p: float) -> float:
    """trtexec's percentile of already sorted samples (``p`` in 0..100), in exact arithmetic.

    trtexec computes ``(1 - p/100) * n`` in float32, which can round a whole number down (for 100
    samples its p99 lands on the maximum); with fractions, p99 of 1..100 is 99 as the definition says.
    """
    if not sorted_samples:
        raise ValueError("no samples")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is not in [0, 100]")
    n = len(sorted_samples)
    exclude = int((1 - Fraction(str(p)) / 100) * n)
    return float(sorted_samples[max(n - 1 - exclude, 0)])


def median(sorted_samples: Sequence[float]) -> float:
    n = len(sorted_samples)
    if n == 0:
        raise ValueError("no samples")
    mid = n // 2
    return float(sorted_samples[mid]) if n % 2 else (sorted_samples[mid - 1] + sorted_samples[mid]) / 2


@dataclass(frozen=True)
class Summary:
    """The summary of one phase's samples, in milliseconds."""

    count: int
    min: float
    max: float
    mean: float
    median: float
    p90: float
    p95: float
    p99: float
    stdev: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(samples: Sequence[float]) -> Summary:
    """Summarize samples (milliseconds). Raises ValueError on an empty list or a non-finite sample."""
    if not samples:
        raise ValueError("no samples to summarize")
    if not all(math.isfinite(s) for s in samples):
        raise ValueError("a sample is not a finite number")
    ordered = sorted(float(s) for s in samples)
    return Summary(
        count=len(ordered),
        min=ordered[0],
        max=ordered[-1],
        mean=math.fsum(ordered) / len(ordered),
        median=median(ordered),
        p90=percentile(ordered, 90),
        p95=percentile(ordered, 95),
        p99=percentile(ordered, 99),
        stdev=statistics.pstdev(ordered) if len(ordered) > 1 else 0.0,
    )


# --------------------------------------------------------------------------- the measurement loop


@dataclass
class Iteration:
    """One timed inference, in milliseconds. ``h2d``/``d2h`` are None where nothing is copied."""

    e2e: float
    compute: float
    h2d: float | None = None
    d2h: float | None = None


@dataclass
class Measurement:
    iterations: list[Iteration]
    wall_s: float  # the measured phase, warm-up excluded
    warmup_iterations: int
    warmup_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self, batch: int = 1) -> dict[str, Any]:
        """Every statistic the catalog stores: a Summary per phase, throughput, counts."""
        n = len(self.iterations)
        out: dict[str, Any] = {
            "iterations": n,
            "wall_s": self.wall_s,
            "warmup_iterations": self.warmup_iterations,
            "warmup_s": self.warmup_s,
            "batch": batch,
            "throughput_qps": n / self.wall_s if self.wall_s > 0 else None,
        }
        out["throughput_items_s"] = out["throughput_qps"] * batch if out["throughput_qps"] else None
        for phase in PHASES:
            values = [v for it in self.iterations if (v := getattr(it, phase)) is not None]
            out[phase] = summarize(values).to_dict() if values else None
        return {**out, **self.extra}


def measure(
    step: Callable[[], Iteration],
    *,
    warmup_ms: float = 200,
    duration_s: float = 3.0,
    min_iterations: int = 10,
    max_iterations: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Warm up for ``warmup_ms`` (at least one call), then time ``step`` until ``duration_s`` has passed
    and ``min_iterations`` were run (or ``max_iterations``, a safety stop for very fast steps)."""
    if min_iterations < 1:
        raise ValueError("min_iterations must be at least 1")
    start = clock()
    warm = 0
    while True:
        step()
        warm += 1
        if (clock() - start) * 1000 >= warmup_ms:
            break
    warmup_s = clock() - start
    iterations: list[Iteration] = []
    begin = clock()
    while True:
        iterations.append(step())
        elapsed = clock() - begin
        if max_iterations is not None and len(iterations) >= max_iterations:
            break
        if elapsed >= duration_s and len(iterations) >= min_iterations:
            break
    return Measurement(iterations, clock() - begin, warm, warmup_s)
