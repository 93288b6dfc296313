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

import hashlib
import json
import math
from dataclasses import fields
from operator import attrgetter
from typing import Any

from enginefarm.core.compat_ortcuda import check_ort_cuda, check_ort_version, is_ort_cuda
from enginefarm.core.domain import (
    ENGINE_FACTS,
    Backend,
    EngineDescriptor,
    HardwareCompat,
    cc_tuple,
)
from enginefarm.core.machine import Machine
from enginefarm.core.profilefit import profile_fit, profile_gap, span
from enginefarm.core.verdicts import (
    NO_CC,
    Check,
    Match,
    Outcome,
    Rule,
    Verdict,
    check_fail,
    check_ok,
    check_relaxed,
    check_unchecked,
    version_tuple,
)

# CUDA major → lowest driver that runs it (CUDA minor-version compatibility).
DRIVER_FLOORS: dict[int, int] = {11: 450, 12: 525, 13: 580}


# Version-compatible engines also run on later runtimes across these major pairs (support matrix).
CROSS_MAJOR: frozenset[tuple[int, int]] = frozenset({(8, 9), (8, 10), (10, 11)})
# Version compatibility exists from TensorRT 8.6 on, for the builder and the runtime alike.
VERSION_COMPAT_FLOOR = (8, 6)


def _runtime_missing(rule: Rule, built: str, runtime: str, other: str, m: Machine) -> Check:
    """The machine did not name this engine's runtime: absent if it named another, else unknown."""
    if m.trt_version or m.trt_rtx_version:
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
    got, want = version_tuple(runtime), version_tuple(built)
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
    floor = DRIVER_FLOORS.get(version_tuple(e.cuda_version)[0])
    if not floor:
        return None
    if not m.driver_version:
        return check_unchecked(
            Rule.DRIVER,
            f"built with CUDA {e.cuda_version}, which needs driver {floor} or newer; your driver is unknown",
        )
    if version_tuple(m.driver_version)[0] < floor:
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


# What the kind checks below read: every fact but the ones each engine has of its own (its bytes, its size and
# activation memory, its profiles, the provider options measured fastest for it), and every field of the machine but
# its memory and the shapes it will run. The same kind of engine (a target, runtime versions, a platform...) repeats
# across models, so a model never seen before is judged mostly from what other models' engines of its kinds were
# judged to be on this kind of machine.
_OWN_FACTS = frozenset({"sha256", "size", "device_memory_bytes", "profiles", "run_options"})
KIND_FACTS = tuple(name for name in ENGINE_FACTS if name not in _OWN_FACTS)
_MACHINE_KIND = tuple(f.name for f in fields(Machine) if f.name not in ("memory_mib", "shapes", "precisions"))
_KINDS_KEPT = 4096
# What a kind's fact is where a row leaves it unset (the catalog's column defaults).
_KIND_DEFAULTS = {"compute_capabilities": [], "hardware_compat": HardwareCompat.NONE.value, "version_compatible": False}


def kind_key(facts: dict[str, Any]) -> int:
    """A kind's facts (KIND_FACTS, by name) as a signed 64-bit number: the same facts, the same number; written with
    each engine (``storage.tables``) so a model's engines are grouped into kinds by one column. Two numbers for
    one kind would only mean judging it twice; a stored number whose facts changed would judge engines by another
    kind's facts, so a change to KIND_FACTS, to this function or to a kind fact outside the ORM needs a migration
    that keys every engine again (``tests/unit/test_engine_facts.py`` pins both)."""
    values = []
    for name in KIND_FACTS:
        value = facts.get(name)
        if value is None:
            value = _KIND_DEFAULTS.get(name)
        values.append(bool(value) if name == "version_compatible" else value)
    text = json.dumps(values, separators=(",", ":")).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big", signed=True)


Key = tuple[Any, ...]
# Per kind pair: the kind's checks; the whole verdict where nothing else is judged; the verdict of a kind that fails
# (shared, for callers that read only whether, why and by which rule an engine does not run).
_kinds: dict[tuple[Key, Key], tuple[tuple[Check, ...], Verdict | None, Verdict | None]] = {}
_last_machine: tuple[Machine | None, Key] = (None, ())


_SCALAR_KIND = tuple(name for name in KIND_FACTS if name != "compute_capabilities")
_scalar_kind = attrgetter(*_SCALAR_KIND)


def _kind_of(e: EngineDescriptor) -> Key:
    return (*_scalar_kind(e), *e.compute_capabilities)


def machine_kind(m: Machine) -> Key:
    """What the kind checks read of a machine (all but its memory, shapes and accepted precisions), as a key."""
    global _last_machine
    last = _last_machine  # one machine judges a whole table: its key is made once
    if last[0] is m:
        return last[1]
    key = tuple(getattr(m, name) for name in _MACHINE_KIND)
    _last_machine = (m, key)
    return key


def _kind_judgement(e: EngineDescriptor, m: Machine) -> tuple[tuple[Check, ...], Verdict | None, Verdict | None]:
    checks, whole = _kind_checks(e, m)
    failed = next((c for c in checks if c.outcome is Outcome.FAIL), None)
    return checks, whole, Verdict(False, None, failed.detail, list(checks)) if failed else None


def _kind_checks(e: EngineDescriptor, m: Machine) -> tuple[tuple[Check, ...], Verdict | None]:
    """The checks that depend only on the engine's kind and the machine's: the platform, the runtime and compute
    capability rules, the driver; and the whole verdict where nothing else is judged (an ONNX Runtime CPU
    artifact)."""
    checks = [_check_platform(e, m)]
    if is_ort_cuda(e):
        checks += [check_ort_cuda(e, m), check_ort_version(e, m)]
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


def _kind(e: EngineDescriptor, m: Machine) -> tuple[tuple[Check, ...], Verdict | None, Verdict | None]:
    key = (_kind_of(e), machine_kind(m))
    kind = _kinds.get(key)
    if kind is None:
        if len(_kinds) >= _KINDS_KEPT:
            _kinds.clear()
        kind = _kinds[key] = _kind_judgement(e, m)
    return kind


def kind_verdict(e: EngineDescriptor, m: Machine) -> Verdict | None:
    """Where every engine of ``e``'s kind fails on ``m`` whatever its own facts (bytes, size, memory, profiles):
    ``judge(x, m, full=False)`` of each, shared; None where each must be judged on its own. ``e`` needs only its
    kind's facts (KIND_FACTS)."""
    _kept, whole, failing = _kind(e, m)
    if failing is None and whole is not None and not whole.runs:
        return whole
    return failing


def judge(e: EngineDescriptor, m: Machine, full: bool = True) -> Verdict:
    """Whether engine ``e`` runs on machine ``m``, how well it matches, and every check behind that.

    The checks of the engine's kind on the machine's kind are judged once and kept (``_kind_checks``; checks are
    immutable, and each verdict gets its own list); the memory and shape checks are the engine's own. ``full=False``:
    an engine whose kind fails here gets its kind's verdict, shared and not to be changed, whose ``runs``, ``reason``
    and ``rule`` are the full verdict's (a kind check fails first) but whose checks leave out the engine's own."""
    kept, whole, failing = _kind(e, m)
    if failing is not None and not full:
        return failing
    if whole is not None:
        return Verdict(whole.runs, whole.match, whole.reason, list(whole.checks))
    # An ONNX Runtime CUDA artifact is a prepared graph: judged with its memory, not by profiles.
    ort = is_ort_cuda(e)
    checks = [*kept, _check_memory(e, m)]
    if not ort and (shapes := _check_shapes(e, m)) is not None:
        checks.append(shapes)
    failed = next((c for c in checks if c.outcome is Outcome.FAIL), None)
    if failed:
        return Verdict(False, None, failed.detail, checks)
    relaxed = [c for c in checks if c.outcome is Outcome.RELAXED]
    if relaxed:
        rules = {c.rule for c in relaxed}
        version = bool(rules & {Rule.TRT_VERSION, Rule.ORT_VERSION}) and Rule.ORT_CUDA not in rules
        match = Match.VERSION_COMPAT if version else Match.HARDWARE_COMPAT
        return Verdict(True, match, "; ".join(c.detail for c in relaxed), checks)
    built = "ONNX Runtime CUDA graph prepared" if ort else "built"
    if e.gpu_name and m.gpu_name and e.gpu_name == m.gpu_name:
        return Verdict(True, Match.EXACT_GPU, f"{built} on your GPU model, {e.gpu_name}", checks)
    reason = f"{built} for your compute capability {e.compute_capability}"
    if e.gpu_name and m.gpu_name and e.hardware_compat == HardwareCompat.NONE.value and not ort:
        reason += f" (on an {e.gpu_name}, not your {m.gpu_name})"
    return Verdict(True, Match.EXACT_CC, reason, checks)
