"""Which engine runs on which machine: NVIDIA's rules, each with its reason.

``judge(engine, machine)`` runs every rule for one engine on one machine and returns the checks
it made, whether the engine runs, and how close a match it is. Which of the engines that run to
prefer is ``enginefarm.core.choose``. Pure: the catalog, the API and the offline client all call it.

A field the machine leaves unknown is not held against an engine; the check says "unchecked". Two
exceptions: a GPU engine needs the machine's compute capability (without it there is no GPU to
choose for), and a fingerprint that names any runtime version names every runtime it has, so an
engine for a runtime it did not name is rejected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import IntEnum
from functools import lru_cache
from operator import attrgetter
from typing import Any

from enginefarm.core.domain import (
    ENGINE_FACTS,
    ORT_CUDA_PREFIX,
    Backend,
    EngineDescriptor,
    HardwareCompat,
    StrEnum,
    cc_tuple,
)
from enginefarm.core.machine import Machine
from enginefarm.core.profilefit import profile_fit, profile_gap, span

# CUDA major → lowest driver that runs it (CUDA minor-version compatibility).
DRIVER_FLOORS: dict[int, int] = {11: 450, 12: 525, 13: 580}

# The lowest compute capability ONNX Runtime's CUDA execution provider runs on, per CUDA major of its build
# (CUDA 13 dropped Maxwell, Pascal and Volta; onnxruntime-gpu's CUDA 12 wheels start at 6.0).
ORT_CUDA_MIN_CC: dict[int, tuple[int, int]] = {12: (6, 0), 13: (7, 5)}

# Version-compatible engines also run on later runtimes across these major pairs (support matrix).
CROSS_MAJOR: frozenset[tuple[int, int]] = frozenset({(8, 9), (8, 10), (10, 11)})
# Version compatibility exists from TensorRT 8.6 on, for the builder and the runtime alike.
VERSION_COMPAT_FLOOR = (8, 6)


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
def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def check_ok(rule: Rule, detail: str) -> Check:
    return Check(rule, Outcome.PASS, detail)


def check_fail(rule: Rule, detail: str) -> Check:
    return Check(rule, Outcome.FAIL, detail)


def check_relaxed(rule: Rule, detail: str) -> Check:
    return Check(rule, Outcome.RELAXED, detail)


def check_unchecked(rule: Rule, detail: str) -> Check:
    return Check(rule, Outcome.UNCHECKED, detail)


NO_CC = "your GPU's compute capability is unknown (no GPU found, or none given), and a GPU engine needs it"


def _names_runtimes(m: Machine) -> bool:
    return bool(m.trt_version or m.trt_rtx_version)


def _runtime_missing(rule: Rule, built: str, runtime: str, other: str, m: Machine) -> Check:
    """The machine did not name this engine's runtime: absent if it named another, else unknown."""
    if _names_runtimes(m):
        return check_fail(Rule.RUNTIME, f"built with {built}; you run no {runtime} runtime (only {other})")
    return check_unchecked(rule, f"built with {built}; your {runtime} version is unknown")


def _check_platform(e: EngineDescriptor, m: Machine) -> Check:
    if not m.platform:
        return check_unchecked(Rule.PLATFORM, f"built for {e.platform}; your platform is unknown")
    if e.platform != m.platform:
        return check_fail(Rule.PLATFORM, f"built for {e.platform}, you run {m.platform}")
    return check_ok(Rule.PLATFORM, f"built for {e.platform}")


def _check_trt_version(e: EngineDescriptor, m: Machine) -> Check:
    runtime = m.trt_version
    built = e.trt_version or e.backend_version
    if runtime is None:
        return _runtime_missing(
            Rule.TRT_VERSION, f"TensorRT {built}", "TensorRT", f"TensorRT-RTX {m.trt_rtx_version}", m
        )
    if m.lean_runtime and not e.version_compatible:
        return check_fail(
            Rule.LEAN_RUNTIME, f"you run only the lean runtime {runtime}, which loads only version-compatible engines"
        )
    if runtime == built:
        return check_ok(Rule.TRT_VERSION, f"built with your TensorRT {built}")
    if not e.version_compatible:
        return check_fail(Rule.TRT_VERSION, f"built with TensorRT {built}, you run {runtime}, not version-compatible")
    got, want = _version(runtime), _version(built)
    if got[:2] < VERSION_COMPAT_FLOOR or want[:2] < VERSION_COMPAT_FLOOR:
        return check_fail(
            Rule.TRT_VERSION,
            f"built with TensorRT {built}, you run {runtime}; version compatibility needs 8.6 or newer on both sides",
        )
    if got < want:
        return check_fail(
            Rule.TRT_VERSION,
            f"built with TensorRT {built}, you run the older {runtime}; "
            "version-compatible engines never run on older runtimes",
        )
    if got[0] != want[0] and (want[0], got[0]) not in CROSS_MAJOR:
        return check_fail(
            Rule.TRT_VERSION,
            f"built with TensorRT {built}, you run {runtime}; "
            f"version compatibility does not cross from {want[0]}.x to {got[0]}.x",
        )
    return check_relaxed(
        Rule.TRT_VERSION, f"version-compatible engine built with TensorRT {built} runs on your {runtime}"
    )


def _check_cc_trt(e: EngineDescriptor, m: Machine) -> Check:
    cc = m.compute_capability
    if cc is None:
        return check_fail(Rule.COMPUTE_CAPABILITY, f"built for compute capability {e.compute_capability}; {NO_CC}")
    if e.hardware_compat == HardwareCompat.AMPERE_PLUS.value:
        if m.is_jetson:
            return check_fail(Rule.HARDWARE_COMPAT, "built Ampere+ hardware-compatible, which Jetson does not support")
        if cc_tuple(cc) < (8, 0):
            return check_fail(
                Rule.HARDWARE_COMPAT,
                f"built Ampere+ hardware-compatible, which needs compute capability 8.0 or newer; you have {cc}",
            )
        if cc != e.compute_capability:
            return check_relaxed(
                Rule.HARDWARE_COMPAT,
                f"Ampere+ hardware-compatible engine built on {e.compute_capability} runs on your {cc}",
            )
        return check_ok(
            Rule.COMPUTE_CAPABILITY, f"built for your compute capability {cc} (Ampere+ hardware-compatible)"
        )
    if cc != e.compute_capability:
        return check_fail(
            Rule.COMPUTE_CAPABILITY,
            f"built for compute capability {e.compute_capability}, you have {cc}, not hardware-compatible",
        )
    return check_ok(Rule.COMPUTE_CAPABILITY, f"built for your compute capability {cc}")


def _check_rtx_release(e: EngineDescriptor, m: Machine) -> Check:
    runtime = m.trt_rtx_version
    if runtime is None:
        return _runtime_missing(
            Rule.RTX_RELEASE, f"TensorRT-RTX {e.backend_version}", "TensorRT-RTX", f"TensorRT {m.trt_version}", m
        )
    if runtime != e.backend_version:
        return check_fail(
            Rule.RTX_RELEASE,
            f"built with TensorRT-RTX {e.backend_version}, you run {runtime}; "
            "TensorRT-RTX engines do not load across releases",
        )
    return check_ok(Rule.RTX_RELEASE, f"built with your TensorRT-RTX {runtime}")


def _check_rtx_cc(e: EngineDescriptor, m: Machine) -> Check:
    cc = m.compute_capability
    ccs = ", ".join(e.compute_capabilities)
    if cc is None:
        return check_fail(Rule.RTX_CC, f"runs on compute capability {ccs}; {NO_CC}")
    if e.compute_capability is None:  # portable engine
        if cc not in e.compute_capabilities:
            return check_fail(Rule.RTX_CC, f"portable TensorRT-RTX engine runs on {ccs}, you have {cc}")
        return check_relaxed(Rule.RTX_CC, f"portable TensorRT-RTX engine; runs on {ccs}")
    if cc != e.compute_capability:
        return check_fail(
            Rule.RTX_CC, f"TensorRT-RTX engine built for compute capability {e.compute_capability}, you have {cc}"
        )
    return check_ok(Rule.RTX_CC, f"built for your compute capability {cc}")


def _check_driver(e: EngineDescriptor, m: Machine) -> Check | None:
    if not e.cuda_version:
        return None
    floor = DRIVER_FLOORS.get(_version(e.cuda_version)[0])
    if not floor:
        return None
    if not m.driver_version:
        return check_unchecked(
            Rule.DRIVER,
            f"built with CUDA {e.cuda_version}, which needs driver {floor} or newer; your driver is unknown",
        )
    if _version(m.driver_version)[0] < floor:
        return check_fail(
            Rule.DRIVER,
            f"built with CUDA {e.cuda_version}, which needs driver {floor} or newer; you have {m.driver_version}",
        )
    return check_ok(Rule.DRIVER, f"driver {m.driver_version} meets CUDA {e.cuda_version}'s floor {floor}")


def engine_memory_bytes(e: EngineDescriptor) -> int:
    """What loading the engine takes on the GPU: its weights (the plan) plus the activation memory, where known."""
    return e.size + (e.device_memory_bytes or 0)


def _check_memory(e: EngineDescriptor, m: Machine) -> Check:
    need = engine_memory_bytes(e)
    what = "plan and activations" if e.device_memory_bytes else "plan"
    if not m.memory_mib:
        return check_unchecked(Rule.MEMORY, f"needs {_mib(need)} MiB ({what}); your GPU memory is unknown")
    if need > m.memory_mib << 20:
        return check_fail(
            Rule.MEMORY, f"engine needs at least {_mib(need)} MiB ({what}), your GPU has {m.memory_mib} MiB"
        )
    return check_ok(Rule.MEMORY, f"needs {_mib(need)} MiB of your {m.memory_mib} MiB")


def _mib(n: int) -> int:
    return max(1, math.ceil(n / (1 << 20)))


def _check_shapes(e: EngineDescriptor, m: Machine) -> Check | None:
    if not m.shapes:
        return None
    if not e.profiles:
        return check_unchecked(Rule.SHAPES, "the engine's optimization profiles are not recorded")
    gaps = [profile_gap(i, p, m.shapes) for i, p in enumerate(e.profiles)]
    fits = [i for i, g in enumerate(gaps) if g is None]
    if not fits:
        return check_fail(Rule.SHAPES, "; ".join(g for g in gaps if g))
    best = min(fits, key=lambda i: profile_fit(e.profiles[i], m.shapes))
    spans = ", ".join(f"{n} {span(e.profiles[best][n])}" for n in m.shapes)
    return check_ok(Rule.SHAPES, f"profile {best} covers your shapes ({spans})")


def is_ort_cuda(e: EngineDescriptor) -> bool:
    """An ONNX Runtime artifact for its CUDA execution provider (target ``onnxruntime/cuda-smXY``)."""
    return e.backend == Backend.ONNXRUNTIME.value and e.target.partition("/")[2].startswith(ORT_CUDA_PREFIX)


def _check_ort_cuda(e: EngineDescriptor, m: Machine) -> Check:
    """An ONNX Runtime CUDA artifact is a prepared graph, not GPU code: it runs on any GPU that the CUDA build of
    ONNX Runtime supports. Its own compute capability is a match; another supported one runs, relaxed."""
    cc, built = m.compute_capability, e.compute_capability
    if not m.ort_cuda:
        said = (
            f"you run ONNX Runtime {m.ort_version} without CUDA"
            if m.ort_version
            else "you did not say you run ONNX Runtime with CUDA (ort_cuda)"
        )
        return check_fail(Rule.ORT_CUDA, f"prepared for ONNX Runtime's CUDA execution provider; {said}")
    if cc is None:
        return check_fail(Rule.COMPUTE_CAPABILITY, f"prepared on compute capability {built}; {NO_CC}")
    if cc == built:
        return check_ok(Rule.COMPUTE_CAPABILITY, f"prepared and measured on your compute capability {cc}")
    major = _version(e.cuda_version or "")[:1]
    floor = ORT_CUDA_MIN_CC.get(major[0]) if major else None
    if floor and cc_tuple(cc) < floor:
        return check_fail(
            Rule.COMPUTE_CAPABILITY,
            f"ONNX Runtime built for CUDA {e.cuda_version} runs on compute "
            f"capability {floor[0]}.{floor[1]} or newer; you have {cc}",
        )
    return check_relaxed(
        Rule.ORT_CUDA,
        f"a graph for ONNX Runtime CUDA prepared on {built} runs on your {cc} "
        "(no GPU code in it; its figures were measured on another GPU)",
    )


def _check_ort_version(e: EngineDescriptor, m: Machine) -> Check:
    """A graph saved by ONNX Runtime after its optimizations may hold its contrib operators, which a later
    release still runs and an earlier one may not."""
    if not m.ort_version:
        return check_unchecked(
            Rule.ORT_VERSION, f"prepared by ONNX Runtime {e.backend_version}; your ONNX Runtime version is unknown"
        )
    got, want = _version(m.ort_version), _version(e.backend_version)
    if got[:2] == want[:2]:
        return check_ok(Rule.ORT_VERSION, f"prepared by ONNX Runtime {e.backend_version}, you run {m.ort_version}")
    if got < want:
        return check_fail(
            Rule.ORT_VERSION,
            f"prepared by ONNX Runtime {e.backend_version}, you run the older "
            f"{m.ort_version}, which may lack its fused operators",
        )
    return check_relaxed(
        Rule.ORT_VERSION, f"prepared by ONNX Runtime {e.backend_version}, runs on your later {m.ort_version}"
    )


def _judge_ort_cuda(e: EngineDescriptor, m: Machine, checks: list[Check]) -> Verdict:
    checks.append(_check_memory(e, m))
    failed = next((c for c in checks if c.outcome is Outcome.FAIL), None)
    if failed:
        return Verdict(False, None, failed.detail, checks)
    relaxed = [c for c in checks if c.outcome is Outcome.RELAXED]
    if any(c.rule is Rule.ORT_CUDA for c in relaxed):
        return Verdict(True, Match.HARDWARE_COMPAT, "; ".join(c.detail for c in relaxed), checks)
    if relaxed:
        return Verdict(True, Match.VERSION_COMPAT, "; ".join(c.detail for c in relaxed), checks)
    if e.gpu_name and m.gpu_name and e.gpu_name == m.gpu_name:
        return Verdict(
            True, Match.EXACT_GPU, f"ONNX Runtime CUDA graph prepared on your GPU model, {e.gpu_name}", checks
        )
    return Verdict(
        True,
        Match.EXACT_CC,
        f"ONNX Runtime CUDA graph prepared for your compute capability {e.compute_capability}",
        checks,
    )


# What the kind checks below read: every fact but the ones each engine has of its own (its bytes, its size and
# activation memory, its profiles), and every field of the machine but its memory and the shapes it will run. The
# same kind of engine (a target, runtime versions, a platform...) repeats across models, so a model never seen
# before is judged mostly from what other models' engines of its kinds were judged to be on this kind of machine.
_OWN_FACTS = frozenset({"sha256", "size", "device_memory_bytes", "profiles"})
_KIND_FACTS = tuple(name for name in ENGINE_FACTS if name not in _OWN_FACTS)
_MACHINE_KIND = tuple(f.name for f in fields(Machine) if f.name not in ("memory_mib", "shapes", "precisions"))
_KINDS_KEPT = 4096
Key = tuple[Any, ...]
_kinds: dict[tuple[Key, Key], tuple[tuple[Check, ...], Verdict | None]] = {}
_last_machine: tuple[Machine | None, Key] = (None, ())


_SCALAR_KIND = tuple(name for name in _KIND_FACTS if name != "compute_capabilities")
_scalar_kind = attrgetter(*_SCALAR_KIND)


def _kind_of(e: EngineDescriptor) -> Key:
    return (*_scalar_kind(e), *e.compute_capabilities)


def _machine_kind(m: Machine) -> Key:
    global _last_machine
    last = _last_machine  # one machine judges a whole table: its key is made once
    if last[0] is m:
        return last[1]
    key = tuple(getattr(m, name) for name in _MACHINE_KIND)
    _last_machine = (m, key)
    return key


def _kind_checks(e: EngineDescriptor, m: Machine) -> tuple[tuple[Check, ...], Verdict | None]:
    """The checks that depend only on the engine's kind and the machine's: the platform, the runtime and compute
    capability rules, the driver; and the whole verdict where nothing else is judged (an ONNX Runtime CPU
    artifact)."""
    checks = [_check_platform(e, m)]
    if is_ort_cuda(e):
        checks += [_check_ort_cuda(e, m), _check_ort_version(e, m)]
    elif e.backend == Backend.ONNXRUNTIME.value:
        runs = checks[0].outcome is not Outcome.FAIL
        reason = f"ONNX Runtime CPU artifact for {e.platform}" if runs else checks[0].detail
        return (), Verdict(runs, Match.CPU_FALLBACK if runs else None, reason, checks)
    elif e.backend == Backend.TENSORRT_RTX.value:
        checks += [_check_rtx_release(e, m), _check_rtx_cc(e, m)]
    else:
        checks += [_check_trt_version(e, m), _check_cc_trt(e, m)]
    if (driver := _check_driver(e, m)) is not None:
        checks.append(driver)
    return tuple(checks), None


def judge(e: EngineDescriptor, m: Machine) -> Verdict:
    """Whether engine ``e`` runs on machine ``m``, how well it matches, and every check behind that.

    The checks of the engine's kind on the machine's kind are judged once and kept (``_kind_checks``; checks are
    immutable, and each verdict gets its own list); the memory and shape checks are the engine's own."""
    key = (_kind_of(e), _machine_kind(m))
    kind = _kinds.get(key)
    if kind is None:
        if len(_kinds) >= _KINDS_KEPT:
            _kinds.clear()
        kind = _kinds[key] = _kind_checks(e, m)
    kept, whole = kind
    if whole is not None:
        return Verdict(whole.runs, whole.match, whole.reason, list(whole.checks))
    checks = list(kept)
    if is_ort_cuda(e):
        return _judge_ort_cuda(e, m, checks)
    checks += [c for c in (_check_memory(e, m), _check_shapes(e, m)) if c is not None]
    failed = next((c for c in checks if c.outcome is Outcome.FAIL), None)
    if failed:
        return Verdict(False, None, failed.detail, checks)
    relaxed = [c for c in checks if c.outcome is Outcome.RELAXED]
    if relaxed:
        version = any(c.rule is Rule.TRT_VERSION for c in relaxed)
        match = Match.VERSION_COMPAT if version else Match.HARDWARE_COMPAT
        return Verdict(True, match, "; ".join(c.detail for c in relaxed), checks)
    if e.gpu_name and m.gpu_name and e.gpu_name == m.gpu_name:
        return Verdict(True, Match.EXACT_GPU, f"built on your GPU model, {e.gpu_name}", checks)
    reason = f"built for your compute capability {e.compute_capability}"
    if e.gpu_name and m.gpu_name and e.hardware_compat == HardwareCompat.NONE.value:
        reason += f" (on an {e.gpu_name}, not your {m.gpu_name})"
    return Verdict(True, Match.EXACT_CC, reason, checks)
