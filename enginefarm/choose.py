"""Which of the engines that run on a machine to prefer: ``choose(options, machine, wanted)`` judges a candidate
set by NVIDIA's rules (``enginefarm.compat.judge``), applies the caller's filters (precision, spec, accuracy,
latency, backend) and ranks the survivors, each exclusion with its rule and reason. Pure: the catalog, the API
and the offline client all call it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from enginefarm.compat import (
    Check, Outcome, Rule, Verdict, check_fail, check_ok, check_relaxed, check_unchecked, judge, shape_fit,
)
from enginefarm.domain import EngineDescriptor
from enginefarm.machine import Machine

@dataclass
class Evidence:
    """What the catalog measured about an engine, as far as ranking needs it."""

    accuracy: str | None = None  # "pass", "fail", or None when never checked
    latency_ms: float | None = None  # median end-to-end latency at the default shape, on the asking GPU model
    latency_on: str | None = None  # the GPU model that latency was measured on


@dataclass
class Option:
    """One candidate engine: its descriptor, which model version it belongs to, and its evidence."""

    id: Any
    engine: EngineDescriptor
    model_seq: int = 0
    spec_hash: str = ""
    evidence: Evidence = field(default_factory=Evidence)


@dataclass
class Wanted:
    """The caller's filters on top of the compatibility rules."""

    precision: str | None = None
    spec_hash: str | None = None
    accuracy: str | None = None  # "pass" keeps only engines that passed their accuracy gate
    max_latency_ms: float | None = None
    backend: str | None = None
    accept: frozenset[str] = frozenset()


@dataclass
class Judged:
    option: Option
    verdict: Verdict
    rank: int | None = None  # 1 for the chosen engine, 2.. for the fallbacks; None when excluded


@dataclass
class Choice:
    ranked: list[Judged]  # chosen first, then the fallbacks in order
    rejected: list[Judged]

    @property
    def chosen(self) -> Judged | None:
        return self.ranked[0] if self.ranked else None


# Precisions whose error depends on calibration: picked unasked only once their accuracy check passed.
QUANTIZED = frozenset({"int8", "fp8"})
ACCEPT = ("unchecked", "failed")


def _accuracy_gate(o: Option, m: Machine, wanted: Wanted) -> Check:
    """The precision policy: a failed accuracy check excludes an engine, and so does an unchecked int8 or fp8 one,
    unless the caller asks for that precision by name or accepts unchecked (or failed) engines."""
    e, accuracy = o.engine, o.evidence.accuracy
    if accuracy == "pass":
        return check_ok(Rule.ACCURACY_GATE, "passed its accuracy check against ONNX Runtime FP32")
    if accuracy == "fail":
        if "failed" in wanted.accept:
            return check_relaxed(Rule.ACCURACY_GATE, "failed its accuracy check; served because you accept failed engines")
        return check_fail(Rule.ACCURACY_GATE, "failed its accuracy check against ONNX Runtime FP32; "
                                         "add accept=failed to get it anyway")
    named = e.precision == wanted.precision or e.precision in m.precisions
    if e.precision in QUANTIZED and not named and "unchecked" not in wanted.accept:
        return check_fail(Rule.ACCURACY_GATE, f"this {e.precision} engine's accuracy was never checked; {e.precision} is "
                                         f"picked only once its check passed: ask for precision={e.precision} or "
                                         "accept=unchecked to get it unchecked")
    return check_unchecked(Rule.ACCURACY_GATE, f"{e.precision} engine whose accuracy is not checked yet")


def _filters(o: Option, m: Machine, wanted: Wanted) -> list[Check]:
    checks = []
    e, ev = o.engine, o.evidence
    if m.precisions and e.precision not in m.precisions:
        checks.append(check_fail(Rule.ACCEPTED_PRECISION, f"built {e.precision}; your machine accepts "
                                                     f"{', '.join(m.precisions)}"))
    if wanted.precision and e.precision != wanted.precision:
        checks.append(check_fail(Rule.PRECISION, f"built {e.precision}, you asked for {wanted.precision}"))
    if wanted.backend and e.backend != wanted.backend:
        checks.append(check_fail(Rule.BACKEND, f"built for {e.backend}, you asked for {wanted.backend}"))
    if wanted.spec_hash and o.spec_hash != wanted.spec_hash:
        checks.append(check_fail(Rule.SPEC, f"built from spec {o.spec_hash[:12]}, you asked for {wanted.spec_hash[:12]}"))
    if wanted.accuracy == "pass" and ev.accuracy != "pass":
        state = "failed its accuracy gate" if ev.accuracy == "fail" else "has no accuracy result yet"
        checks.append(check_fail(Rule.ACCURACY, f"engine {state}; you asked for accuracy=pass"))
    if wanted.max_latency_ms is not None:
        if ev.latency_ms is None:
            checks.append(check_fail(Rule.LATENCY, f"no latency measured on your GPU model to hold against "
                                              f"{wanted.max_latency_ms:g} ms"))
        elif ev.latency_ms > wanted.max_latency_ms:
            checks.append(check_fail(Rule.LATENCY, f"median latency {ev.latency_ms:.3g} ms on {ev.latency_on} exceeds "
                                              f"your maximum {wanted.max_latency_ms:g} ms"))
    return checks


_ACCURACY_ORDER = {"pass": 0, None: 1, "fail": 2}


def rank_key(j: Judged, shapes: dict[str, dict[str, list[int]]] | None = None) -> tuple:
    """Match first; then a passed accuracy gate over none over a failed one; then, when the machine names its
    shapes, the narrowest covering profile and the opt nearest the request (``profile_fit``); then lower latency
    on the asking GPU model; then the newer model version; then the newer engine."""
    ev = j.option.evidence
    latency = ev.latency_ms if ev.latency_ms is not None else math.inf
    fit = shape_fit(j.option.engine, shapes or {}) or (math.inf, math.inf)
    return (j.verdict.match, _ACCURACY_ORDER.get(ev.accuracy, 1), fit, latency, -j.option.model_seq,
            _newest(j.option.id))


def _newest(key: Any) -> Any:
    return -key if isinstance(key, (int, float)) else key


def choose(options: list[Option], machine: Machine, wanted: Wanted | None = None) -> Choice:
    """Judge every option for ``machine``, drop what the filters exclude, rank the rest best first."""
    wanted = wanted or Wanted()
    runnable, rejected = [], []
    for o in options:
        verdict = judge(o.engine, machine)
        excluded = _filters(o, machine, wanted)
        gate = _accuracy_gate(o, machine, wanted)
        # An engine that does not run is excluded by its compatibility rule; the gate only speaks for one that does.
        if gate.outcome is Outcome.FAIL and verdict.runs:
            excluded.append(gate)
        else:
            verdict.checks.append(gate)
        if excluded:
            verdict = Verdict(False, None, excluded[0].detail, excluded + verdict.checks)
        (runnable if verdict.runs else rejected).append(Judged(o, verdict))
    runnable.sort(key=lambda j: rank_key(j, machine.shapes))
    for i, j in enumerate(runnable, start=1):
        j.rank = i
    return Choice(runnable, rejected)
