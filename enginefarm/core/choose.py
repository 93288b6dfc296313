"""Which of the engines that run on a machine to prefer: ``choose(options, machine, wanted)`` judges a candidate
set by NVIDIA's rules (``enginefarm.core.compat.judge``), applies the caller's filters (precision, spec, accuracy,
latency, backend) and ranks the survivors, each exclusion with its rule and reason. Pure: the catalog, the API
and the offline client all call it."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from enginefarm.core.compat import judge, kind_verdict, machine_kind
from enginefarm.core.domain import EngineDescriptor
from enginefarm.core.fleet import FLEET, describe_class
from enginefarm.core.machine import Machine
from enginefarm.core.profilefit import shape_fit
from enginefarm.core.verdicts import Check, Outcome, Rule, Verdict, check_fail, check_ok, check_relaxed, check_unchecked
from enginefarm.core.wanted import Wanted


@dataclass
class Evidence:
    """What the catalog measured about an engine, as far as ranking needs it."""

    accuracy: str | None = None  # "pass", "fail", or None when never checked
    # Median end-to-end latency at the default shape by the device class it was measured on: "gpu:<GPU model>",
    # "cc:<compute capability>" (both for a GPU measurement) or "cpu:<CPU model>".
    latencies: dict[str, float] = field(default_factory=dict)
    # The input shapes each of those latencies was measured at, by device class (canonical JSON text): two engines'
    # latencies are compared only where they were measured at the same shapes. Absent: not known, taken as alike.
    shapes: dict[str, str] = field(default_factory=dict)
    # For a fleet class (``enginefarm.core.fleet``): how many machines its latency is the median of.
    machines: dict[str, int] = field(default_factory=dict)
    # Set by ``choose``: the latency on the device class the ranking compared, and that class.
    latency_ms: float | None = None
    latency_on: str | None = None


@dataclass
class Option:
    """One candidate engine: its descriptor, which model version it belongs to, and its evidence."""

    id: Any
    engine: EngineDescriptor
    model_seq: int = 0
    spec_hash: str = ""
    evidence: Evidence = field(default_factory=Evidence)


@dataclass
class Judged:
    option: Option
    verdict: Verdict
    rank: int | None = None  # 1 for the chosen engine, 2.. for the fallbacks; None when excluded


@dataclass
class Choice:
    ranked: list[Judged]  # chosen first, then the fallbacks in order
    rejected: list[Judged]
    ranked_by: str = ""  # how the chosen engine won over the others that run, with the latencies compared

    @property
    def chosen(self) -> Judged | None:
        return self.ranked[0] if self.ranked else None


K = TypeVar("K")
# Precisions whose error depends on calibration: picked unasked only once their accuracy check passed.
QUANTIZED = frozenset({"int8", "fp8"})


def _accuracy_gate(o: Option, m: Machine, wanted: Wanted) -> Check:
    """The precision policy: a failed accuracy check excludes an engine, and so does an unchecked int8 or fp8 one,
    unless the caller asks for that precision by name or accepts unchecked (or failed) engines."""
    e, accuracy = o.engine, o.evidence.accuracy
    if accuracy == "pass":
        return check_ok(Rule.ACCURACY_GATE, "passed its accuracy check against ONNX Runtime FP32")
    if accuracy == "fail":
        if "failed" in wanted.accept:
            return check_relaxed(
                Rule.ACCURACY_GATE, "failed its accuracy check; served because you accept failed engines"
            )
        return check_fail(
            Rule.ACCURACY_GATE,
            "failed its accuracy check against ONNX Runtime FP32; add accept=failed to get it anyway",
        )
    named = e.precision == wanted.precision or e.precision in m.precisions
    if e.precision in QUANTIZED and not named and "unchecked" not in wanted.accept:
        return check_fail(
            Rule.ACCURACY_GATE,
            f"this {e.precision} engine's accuracy was never checked; {e.precision} is "
            f"picked only once its check passed: ask for precision={e.precision} or "
            "accept=unchecked to get it unchecked",
        )
    return check_unchecked(Rule.ACCURACY_GATE, f"{e.precision} engine whose accuracy is not checked yet")


def _filters(o: Option, m: Machine, wanted: Wanted) -> list[Check]:
    checks = []
    e, ev = o.engine, o.evidence
    if m.precisions and e.precision not in m.precisions:
        checks.append(
            check_fail(Rule.ACCEPTED_PRECISION, f"built {e.precision}; your machine accepts {', '.join(m.precisions)}")
        )
    if wanted.precision and e.precision != wanted.precision:
        checks.append(check_fail(Rule.PRECISION, f"built {e.precision}, you asked for {wanted.precision}"))
    if wanted.backend and e.backend != wanted.backend:
        checks.append(check_fail(Rule.BACKEND, f"built for {e.backend}, you asked for {wanted.backend}"))
    if wanted.spec_hash and o.spec_hash != wanted.spec_hash:
        checks.append(
            check_fail(Rule.SPEC, f"built from spec {o.spec_hash[:12]}, you asked for {wanted.spec_hash[:12]}")
        )
    if wanted.accuracy == "pass" and ev.accuracy != "pass":
        state = "failed its accuracy gate" if ev.accuracy == "fail" else "has no accuracy result yet"
        checks.append(check_fail(Rule.ACCURACY, f"engine {state}; you asked for accuracy=pass"))
    if wanted.max_latency_ms is not None:
        own = next(((c, ev.latencies[c]) for c in device_classes(m) if c in ev.latencies), None)
        if own is None:
            checks.append(
                check_fail(
                    Rule.LATENCY,
                    f"no latency measured on your "
                    f"{'GPU model' if m.gpu_name else 'machine'} to hold against "
                    f"{wanted.max_latency_ms:g} ms",
                )
            )
        elif own[1] > wanted.max_latency_ms:
            checks.append(
                check_fail(
                    Rule.LATENCY,
                    f"median latency {own[1]:.3g} ms on {_on(own[0])} exceeds your "
                    f"maximum {wanted.max_latency_ms:g} ms",
                )
            )
    return checks


def _named_runtime(o: Option, m: Machine, wanted: Wanted) -> Check | None:
    """A machine that names its GPU runtime is handed that runtime's engines: a CPU artifact only when it asks."""
    runtimes, e = m.gpu_runtimes, o.engine
    if runtimes and is_cpu_artifact(e) and "cpu" not in wanted.accept and wanted.backend != e.backend:
        return check_fail(
            Rule.NAMED_RUNTIME,
            f"an ONNX Runtime CPU artifact, and your machine names "
            f"{' and '.join(runtimes)}: add accept=cpu (fetch --allow-cpu) to be "
            "handed it",
        )
    return None


def judged_by_kind(wanted: Wanted) -> bool:
    """Whether every filter asked for reads only an engine's kind (its precision and backend, against the machine's
    accepted precisions): then ``kind_rule`` tells, for a whole kind of engine at once, what ``choose`` without
    checks excludes each of its engines by."""
    return wanted.spec_hash is None and wanted.accuracy is None and wanted.max_latency_ms is None


def kind_rule(kind: EngineDescriptor, machine: Machine, wanted: Wanted) -> Rule | None:
    """The rule by which ``choose(..., checks=False)`` excludes every engine of this kind (an engine's KIND_FACTS;
    its own facts are not read): the first filter that refuses it, else the compatibility rule its kind fails on;
    None where its engines are judged one by one. Only where ``judged_by_kind(wanted)``."""
    excluded = _filters(Option(None, kind), machine, wanted)
    if excluded:
        return excluded[0].rule
    failing = kind_verdict(kind, machine)
    return failing.rule if failing is not None else None


_KIND_RULES: dict[tuple[Any, ...], Rule | None] = {}
_KIND_RULES_KEPT = 16_384
_UNSEEN: Any = object()


def kind_rules(
    kinds: Sequence[Hashable], describe: Callable[[Any], EngineDescriptor], machine: Machine, wanted: Wanted
) -> list[Rule | None]:
    """``kind_rule`` of each kind, a kind given as a hashable value of its facts (a row of them) that ``describe``
    makes an EngineDescriptor of: kept per kind, kind of machine and kind-level filter, so a kind seen before (in
    any model's engines) costs a lookup, and only a kind never seen is described and judged."""
    asked = (machine_kind(machine), tuple(machine.precisions), wanted.precision, wanted.backend)
    out = []
    for kind in kinds:
        key = (kind, asked)
        rule = _KIND_RULES.get(key, _UNSEEN)  # one lookup: a clear by another thread in between is harmless
        if rule is _UNSEEN:
            if len(_KIND_RULES) >= _KIND_RULES_KEPT:
                _KIND_RULES.clear()
            rule = _KIND_RULES[key] = kind_rule(describe(kind), machine, wanted)
        out.append(rule)
    return out


def is_cpu_artifact(e: EngineDescriptor) -> bool:
    return e.target.startswith("onnxruntime/cpu-")


def device_classes(m: Machine) -> list[str]:
    """The device classes a latency may have been measured on that stand for this machine, nearest first: its GPU
    model, its compute capability, its CPU, each measured by the farm's workers, then by the fleet."""
    own = [
        c
        for c in (
            m.gpu_name and f"gpu:{m.gpu_name}",
            m.compute_capability and f"cc:{m.compute_capability}",
            m.cpu_name and f"cpu:{m.cpu_name}",
        )
        if c
    ]
    return [x for c in own for x in (c, FLEET + c)]


@dataclass(frozen=True)
class Figure:
    """One latency of an engine on one of the asking machine's device classes: the farm's or the fleet's."""

    source: str  # "farm" or "fleet"
    device_class: str
    on: str  # the class in words
    latency_ms: float
    machines: int | None = None  # for the fleet's: how many machines its median is of


def figures_for(ev: Evidence, m: Machine) -> list[Figure]:
    """Every latency of an engine on the machine's own classes, nearest first, the farm's and the fleet's side by
    side (never mixed): what an answer shows beside the figure its ranking compared."""
    return [
        Figure("fleet" if c.startswith(FLEET) else "farm", c, _on(c, ev.machines.get(c)), ms, ev.machines.get(c))
        for c in device_classes(m)
        if (ms := ev.latencies.get(c)) is not None
    ]


def _on(device_class: str, machines: int | None = None) -> str:
    if device_class.startswith(FLEET):
        return describe_class(device_class, machines)
    kind, _, name = device_class.partition(":")
    return {"gpu": name, "cc": f"compute capability {name}", "cpu": f"the CPU {name}"}.get(kind, device_class)


_ACCURACY_ORDER = {"pass": 0, None: 1, "fail": 2}


def _tier(e: EngineDescriptor) -> int:
    """Without a measurement that says otherwise, fp32/fp16/bf16 before a calibrated precision."""
    return 1 if e.precision in QUANTIZED else 0


def reference_class(group: list[Judged], m: Machine) -> str | None:
    """The one device class a match group's latencies are compared on: of the asking machine's own classes (its GPU
    model, its compute capability, its CPU) or, for CPU artifacts, any CPU the farm measured on, the one that
    measured the most of the group; a tie goes to the machine's nearest class."""
    own = device_classes(m)
    counts: dict[str, int] = {}
    for j in group:
        for c in j.option.evidence.latencies:
            if c in own or (c.removeprefix(FLEET).startswith("cpu:") and is_cpu_artifact(j.option.engine)):
                counts[c] = counts.get(c, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda c: (counts[c], -own.index(c) if c in own else -len(own), c))


def reference_shapes(group: list[Judged], ref: str) -> str | None:
    """The input shapes a group's latencies on ``ref`` are compared at: those most of its engines were measured at
    there (a benchmark at the opt shapes of its own build: two builds' opt shapes may differ); a tie goes to the
    fastest engine's."""
    by_shapes: dict[str | None, list[float]] = {}
    for j in group:
        ev = j.option.evidence
        if (ms := ev.latencies.get(ref)) is not None:
            by_shapes.setdefault(ev.shapes.get(ref), []).append(ms)
    return most_shared(by_shapes)


def most_shared(by_shapes: dict[K, list[float]]) -> K | None:
    """Of latencies grouped by the input shapes they were measured at, the shapes most of them share; a tie goes to
    the fastest's. None when there are none. The resolver's ranking and the report's best variant both compare at
    these."""
    return max(by_shapes, key=lambda s: (len(by_shapes[s]), -min(by_shapes[s])), default=None)


def _ranked(group: list[Judged], m: Machine) -> tuple[list[Judged], str]:
    """One match group ranked, and how: by measured latency on the reference class when every engine of the group
    was measured there at the same input shapes; else fp32/fp16 before int8/fp8, then measured latency. So an int8
    engine wins only by a measurement made beside its competitors, never by being newer or by a smaller input."""
    ref = reference_class(group, m)
    at = reference_shapes(group, ref) if ref else None
    elsewhere: set[int] = set()  # measured on the reference class, but at other input shapes: not comparable
    for j in group:
        ev = j.option.evidence
        ev.latency_ms = ev.latencies.get(ref) if ref else None
        if ref and ev.latency_ms is not None and ev.shapes.get(ref) != at:
            ev.latency_ms = None
            elsewhere.add(id(j))
        ev.latency_on = _on(ref, ev.machines.get(ref)) if ref and ev.latency_ms is not None else None
    measured = ref is not None and all(j.option.evidence.latency_ms is not None for j in group)

    def key(j: Judged) -> tuple[Any, ...]:
        ev, o = j.option.evidence, j.option
        fit = shape_fit(o.engine, m.shapes or {}) or (math.inf, math.inf)
        latency = ev.latency_ms if ev.latency_ms is not None else math.inf
        by_speed = (latency, _tier(o.engine)) if measured else (_tier(o.engine), latency)
        return (_ACCURACY_ORDER.get(ev.accuracy, 1), fit, *by_speed, -o.model_seq, _newest(o.id))

    group = sorted(group, key=key)
    if len(group) < 2:
        return group, ""
    figures = ", ".join(
        f"{_label(j)} {j.option.evidence.latency_ms:.3g} ms{_machines(j, ref)}"
        if j.option.evidence.latency_ms is not None
        else f"{_label(j)} {'measured only at other input shapes' if id(j) in elsewhere else 'not measured'}"
        for j in group[:6]
    )
    if measured and ref:
        most = max((j.option.evidence.machines.get(ref, 0) for j in group), default=0)
        return group, f"fastest measured on {_on(ref, most or None)}: {figures}"
    where = f" on {_on(ref)}" if ref else ""
    return group, (
        f"not every engine was measured{where}, so fp32/fp16 rank before int8/fp8, then measured latency: {figures}"
    )


def _machines(j: Judged, ref: str | None) -> str:
    """ " on 3 machines" after a fleet figure: the number of machines its median is of."""
    n = j.option.evidence.machines.get(ref) if ref else None
    return f" on {n} machine{'s' if n != 1 else ''}" if n else ""


def _label(j: Judged) -> str:
    return f"engine {j.option.id} ({j.option.engine.target} {j.option.engine.precision})"


def _newest(key: Any) -> Any:
    return -key if isinstance(key, (int, float)) else key


def choose(options: list[Option], machine: Machine, wanted: Wanted | None = None, checks: bool = True) -> Choice:
    """Judge every option for ``machine``, drop what the filters exclude, rank the rest best first. ``checks=False``:
    an engine that does not run gets only what an answer without ``explain`` shows of it (whether it runs, the rule
    and the reason), not every check behind that."""
    wanted = wanted or Wanted()
    runnable: list[Judged] = []
    rejected: list[Judged] = []
    for o in options:
        verdict = judge(o.engine, machine, full=checks)
        excluded = _filters(o, machine, wanted)
        if not (checks or verdict.runs):  # the gate would only add a check to it
            if excluded:
                verdict = Verdict(False, None, excluded[0].detail, excluded)
            rejected.append(Judged(o, verdict))
            continue
        gate = _accuracy_gate(o, machine, wanted)
        # An engine that does not run is excluded by its compatibility rule; the gate and the runtime the machine
        # named only speak for one that does.
        if verdict.runs and (named := _named_runtime(o, machine, wanted)) is not None:
            excluded.append(named)
        if gate.outcome is Outcome.FAIL and verdict.runs:
            excluded.append(gate)
        else:
            verdict.checks.append(gate)
        if excluded:
            verdict = Verdict(False, None, excluded[0].detail, excluded + verdict.checks)
        (runnable if verdict.runs else rejected).append(Judged(o, verdict))
    # Closeness of match first (exact GPU, compute capability, Ampere+, version-compatible, CPU); within a match,
    # a passed accuracy gate, the narrowest covering profile, then speed as measured (``_ranked``).
    ranked, ranked_by = [], ""
    for match in sorted({j.verdict.match for j in runnable if j.verdict.match is not None}):  # a run has a match
        group, how = _ranked([j for j in runnable if j.verdict.match == match], machine)
        ranked += group
        ranked_by = ranked_by or how
    for i, j in enumerate(ranked, start=1):
        j.rank = i
    return Choice(ranked, rejected, ranked_by)
