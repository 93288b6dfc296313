"""trtexec's build flags as a build spec, so a command line that works with trtexec works with the farm.

Takes the flags as trtexec spells them (``--fp16``, ``--memPoolSize=workspace:4096M``, ...), from the command's own
options or from one ``--trtexec-args "..."`` string as TensorRT Cloud's CLI takes them. A flag that names a file on
the caller's machine, or one the farm sets itself, is refused with the reason; nothing is silently dropped.
"""

from __future__ import annotations

import difflib
import re
import shlex
from typing import Any

from enginefarm.core.shapes import spec_shapes_from_trtexec

# Lowest first: with several precision flags, the build may use the lowest (as trtexec enables them all).
PRECISION_FLAGS = {"--fp8": "fp8", "--best": "int8", "--int8": "int8", "--bf16": "bf16", "--fp16": "fp16"}
HARDWARE_LEVELS = {
    "none": "none",
    "ampere+": "ampere_plus",
    "ampere_plus": "ampere_plus",
    "samecomputecapability": "same_compute_capability",
    "same_compute_capability": "same_compute_capability",
}
_UNITS = {"B": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024}
MAX_WORKSPACE_MIB = 1 << 20  # 1 TiB: BuildSpec.workspace_mib's own bound
VALUE_FLAGS = (
    "--shapes",
    "--minShapes",
    "--optShapes",
    "--maxShapes",
    "--memPoolSize",
    "--builderOptimizationLevel",
    "--hardwareCompatibilityLevel",
    "--timingCacheFile",
)
# Flags the farm sets itself, and why they are not taken.
NOT_TAKEN = {
    "--onnx": "the model is the one uploaded to the farm",
    "--saveEngine": "the farm stores the engine; `enginefarm fetch` puts it where you want",
    "--loadEngine": "the farm builds from the uploaded model",
    "--plugins": "the farm never loads plugin libraries that come with a request",
    "--staticPlugins": "the farm never loads plugin libraries that come with a request",
    "--dynamicPlugins": "the farm never loads plugin libraries that come with a request",
    "--device": "the worker picks its GPU",
}
SWITCHES = ("--stronglyTyped", "--versionCompatible", "--vc")
# Every flag spec_from_trtexec reads, for the did-you-mean of one it does not know; and every one it reads or refuses.
KNOWN_FLAGS = (*PRECISION_FLAGS, *VALUE_FLAGS, *SWITCHES)
TRTEXEC_FLAGS = frozenset({*KNOWN_FLAGS, *NOT_TAKEN})


def memory_mib(text: str) -> int:
    """``4096``, ``4096M``, ``4G``, ``512K``: trtexec's pool size syntax (no suffix: MiB) in MiB, at most
    ``MAX_WORKSPACE_MIB``."""
    match = re.fullmatch(r"([0-9]{1,30}(?:\.[0-9]{1,30})?)([BKMG]?)", text.strip())
    if not match:
        raise ValueError(
            f"not a size: {text[:40]!r}{'...' if len(text) > 40 else ''}; give e.g. 4096M or 4G, "
            f"at most {MAX_WORKSPACE_MIB >> 10}G"
        )
    mib = float(match[1]) * _UNITS[match[2] or "M"]
    if mib < 1:
        raise ValueError(f"{text!r} is under 1 MiB")
    if mib > MAX_WORKSPACE_MIB:
        raise ValueError(f"{text!r} is over {MAX_WORKSPACE_MIB >> 10}G, the largest workspace a build may ask for")
    return int(mib)


def spec_from_trtexec(args: str | list[str]) -> dict[str, Any]:
    """The spec fields these trtexec flags set. Raises ValueError naming every flag it cannot take."""
    tokens = shlex.split(args) if isinstance(args, str) else list(args)
    spec: dict[str, Any] = {}
    shapes: dict[str, str] = {}
    precisions: list[str] = []
    problems: list[str] = []
    rest = iter(tokens)
    for token in rest:
        flag, sep, value = token.partition("=")
        has_value = bool(sep)
        if flag in VALUE_FLAGS and not has_value:  # "--shapes x:1x3" as a shell splits "--shapes=x:1x3" apart
            value = next(rest, "")
            has_value, token = bool(value), f"{flag}={value}"
        if flag in PRECISION_FLAGS and not has_value:
            precisions.append(PRECISION_FLAGS[flag])
        elif flag in SWITCHES and not has_value:
            spec["strongly_typed" if flag == "--stronglyTyped" else "version_compatible"] = True
        elif flag in ("--shapes", "--minShapes", "--optShapes", "--maxShapes") and value:
            shapes[flag.removeprefix("--")] = value
        elif flag == "--memPoolSize" and value:
            for pool in value.split(","):
                name, _, size = pool.partition(":")
                shown = pool if len(pool) <= 60 else pool[:40] + "..."
                if name != "workspace":
                    problems.append(f"--memPoolSize={shown}: only the workspace pool can be set")
                    continue
                try:
                    spec["workspace_mib"] = memory_mib(size)
                except ValueError as exc:
                    problems.append(f"--memPoolSize={shown}: {exc}")
        elif flag == "--builderOptimizationLevel" and value:
            if not re.fullmatch(r"0*[0-5]", value):  # not str.isdigit(): it takes '²' and 5000-digit numbers
                problems.append(f"{token}: give a level from 0 to 5")
            else:
                spec["optimization_level"] = int(value)
        elif flag == "--hardwareCompatibilityLevel" and value:
            level = HARDWARE_LEVELS.get(value.lower())
            if level is None:
                problems.append(f"{token}: give none, ampere+ or sameComputeCapability")
            else:
                spec["hardware_compatibility"] = level
        elif flag == "--timingCacheFile" and value:
            spec["timing_cache"] = True  # each worker keeps its own timing cache; a file here cannot reach it
        elif flag in NOT_TAKEN:
            problems.append(f"{flag}: {NOT_TAKEN[flag]}")
        else:
            near = difflib.get_close_matches(flag, KNOWN_FLAGS, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near and flag.startswith("-") else ""
            problems.append(f"{token}: not a trtexec build flag the farm takes{hint}")
    if precisions:
        spec["precision"] = min(precisions, key=list(PRECISION_FLAGS.values()).index)
    if shapes:
        spec.update(
            spec_shapes_from_trtexec(
                shapes.get("shapes"), shapes.get("minShapes"), shapes.get("optShapes"), shapes.get("maxShapes")
            )
        )
    if problems:
        raise ValueError("; ".join(problems))
    return spec
