"""What judging an engine yields: each check with its rule and outcome, the verdict they make, and how close a
match an engine that runs is. The types ``enginefarm.core.compat``'s rules and ``enginefarm.core.choose``'s filters
both write."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache

from enginefarm.core.domain import StrEnum

NO_CC = "your GPU's compute capability is unknown (no GPU found, or none given), and a GPU engine needs it"


class Match(IntEnum):
    """How close a runnable engine fits; lower is better."""

    EXACT_GPU = 0  # built on this GPU model, for this runtime
    EXACT_CC = 1  # built for this compute capability, for this runtime
    HARDWARE_COMPAT = 2  # an Ampere+ engine from another compute capability, or a portable TensorRT-RTX engine
    VERSION_COMPAT = 3  # runs on a later runtime through version compatibility (may be slower)
    CPU_FALLBACK = 4  # the ONNX Runtime artifact

    @property
    def label(self) -> str:
        return self.name.lower()


class Rule(StrEnum):
    """The rule a check applies; rejections cite it."""

    PLATFORM = "platform"
    RUNTIME = "runtime"
    TRT_VERSION = "trt-version"
    LEAN_RUNTIME = "lean-runtime"
    COMPUTE_CAPABILITY = "compute-capability"
    HARDWARE_COMPAT = "hardware-compat"
    RTX_RELEASE = "rtx-release"
    RTX_CC = "rtx-cc"
    ORT_CUDA = "ort-cuda"
    ORT_VERSION = "ort-version"
    DRIVER = "driver-floor"
    MEMORY = "memory"
    SHAPES = "shapes"
    ACCEPTED_PRECISION = "precision"
    ACCURACY_GATE = "accuracy-gate"
    NAMED_RUNTIME = "named-runtime"  # a machine that names its GPU runtime is not handed another's file unasked
    # the caller's filters
    PRECISION = "filter:precision"
    SPEC = "filter:spec-hash"
    ACCURACY = "filter:accuracy"
    LATENCY = "filter:max-latency"
    BACKEND = "filter:backend"


class Outcome(StrEnum):
    PASS = "pass"
    RELAXED = "relaxed"  # passes through a compatibility mode, not by an exact match
    FAIL = "fail"
    UNCHECKED = "unchecked"  # the machine did not say


@dataclass(frozen=True)
class Check:
    rule: Rule
    outcome: Outcome
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule.value, "outcome": self.outcome.value, "detail": self.detail}


@dataclass
class Verdict:
    runs: bool
    match: Match | None
    reason: str
    checks: list[Check] = field(default_factory=list)

    @property
    def rule(self) -> Rule | None:
        """The rule that excluded the engine; None when it runs."""
        return next((c.rule for c in self.checks if c.outcome is Outcome.FAIL), None)

    @property
    def unchecked(self) -> list[str]:
        return [c.rule.value for c in self.checks if c.outcome is Outcome.UNCHECKED]


@lru_cache(maxsize=4096)
def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def check_ok(rule: Rule, detail: str) -> Check:
    return Check(rule, Outcome.PASS, detail)


def check_fail(rule: Rule, detail: str) -> Check:
    return Check(rule, Outcome.FAIL, detail)


def check_relaxed(rule: Rule, detail: str) -> Check:
    return Check(rule, Outcome.RELAXED, detail)


def check_unchecked(rule: Rule, detail: str) -> Check:
    return Check(rule, Outcome.UNCHECKED, detail)
