"""The accuracy gate: an engine's outputs against ONNX Runtime FP32 on the original model, same inputs.

Float outputs are gated elementwise, as Polygraphy compares: every element must satisfy
``|engine - reference| <= atol + rtol * |reference|``. A relative figure over the whole tensor (relative L2)
is not a fair gate on outputs that are mostly near zero (a probability map, a detector's objectness): an
fp32 artifact matching to 1e-9 can still show a large relative L2. Cosine similarity and relative L2 are
reported beside it, and quantized precisions, whose error scales with each tensor's range, are gated on
them instead. Integer and boolean outputs (indices, classes, masks) are compared by agreement: the
fraction of elements that are equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypedDict, overload

import numpy as np
from numpy.typing import NDArray

from enginefarm.core.spec import ACCURACY_LIMITS, ELEMENTWISE_PARAMS

REFERENCE = "onnxruntime fp32 on the original model"

# The stored accuracy result ``judge`` makes ("pass" is a keyword, hence the functional form).
Judgement = TypedDict(
    "Judgement",
    {
        "reference": str,
        "outputs": dict[str, dict[str, float]],  # per output, its figures (the worst over batches)
        "worst": dict[str, float],  # each figure's worst over the outputs
        "limits": dict[str, float],
        "pass": bool,
        "failures": dict[str, list[str]],  # per failing output, the limits it breaks, in words
    },
)


def metrics(
    reference: NDArray[Any], candidate: NDArray[Any], atol: float | None = None, rtol: float | None = None
) -> dict[str, float]:
    """The figures of one output on one batch, computed in float64.

    Float outputs: max abs, mean abs, relative L2 (‖c − r‖ / ‖r‖), cosine similarity and ``violations``, the
    fraction of elements outside ``atol + rtol*|r|`` (only when a tolerance is given: quantized precisions are not
    judged elementwise). Integer and boolean outputs: ``agreement`` and max abs.
    Two all-zero tensors are identical (cosine 1, relative L2 0); NaN or inf anywhere in the candidate
    makes every figure fail rather than pass silently.
    """
    reference, candidate = np.asarray(reference), np.asarray(candidate)
    if reference.shape != candidate.shape:
        raise ValueError(f"output shapes differ: reference {list(reference.shape)}, engine {list(candidate.shape)}")
    if reference.dtype.kind in "biu" and candidate.dtype.kind in "biu":
        return _exact_metrics(reference, candidate)
    r = np.asarray(reference, dtype=np.float64).ravel()
    c = np.asarray(candidate, dtype=np.float64).ravel()
    elementwise = atol is not None or rtol is not None
    atol, rtol = atol or 0.0, rtol or 0.0
    if r.size == 0:
        return {
            "max_abs": 0.0,
            "mean_abs": 0.0,
            "rel_l2": 0.0,
            "cosine": 1.0,
            **({"violations": 0.0} if elementwise else {}),
        }
    if not np.all(np.isfinite(c)):
        return {
            "max_abs": math.inf,
            "mean_abs": math.inf,
            "rel_l2": math.inf,
            "cosine": -1.0,
            "violations": 1.0,
            "non_finite": True,
        }
    diff = np.abs(c - r)
    r_norm, c_norm = float(np.linalg.norm(r)), float(np.linalg.norm(c))
    d_norm = float(np.linalg.norm(c - r))
    rel = d_norm / r_norm if r_norm > 0 else (0.0 if d_norm == 0 else math.inf)
    if r_norm == 0 and c_norm == 0:
        cosine = 1.0
    elif r_norm == 0 or c_norm == 0:
        cosine = 0.0
    else:
        cosine = float(np.dot(r, c) / (r_norm * c_norm))
    out = {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "rel_l2": rel, "cosine": cosine}
    if elementwise:
        out["violations"] = float(np.count_nonzero(diff > atol + rtol * np.abs(r)) / r.size)
    return out


def _exact_metrics(reference: NDArray[Any], candidate: NDArray[Any]) -> dict[str, float]:
    if reference.size == 0:
        return {"agreement": 1.0, "max_abs": 0.0}
    equal = np.count_nonzero(reference == candidate) / reference.size
    diff = np.abs(reference.astype(np.float64) - candidate.astype(np.float64))
    return {"agreement": float(equal), "max_abs": float(diff.max())}


def merge(per_batch: Iterable[dict[str, float]]) -> dict[str, float]:
    """The worst of each figure over several batches."""
    out: dict[str, float] = {}
    for m in per_batch:
        for key, value in m.items():
            if key not in ACCURACY_LIMITS:
                continue
            worse = min if ACCURACY_LIMITS[key] == "min" else max
            out[key] = value if key not in out else worse(out[key], value)
    return out


def failures(values: dict[str, float], limits: dict[str, float]) -> list[str]:
    """Which limits these figures break, in words; empty when they pass. A figure the output does not have
    (agreement of a float output, violations of an integer one) is not judged."""
    broken = []
    for key, limit in limits.items():
        value = values.get(key)
        if value is None or key in ELEMENTWISE_PARAMS:
            continue
        if ACCURACY_LIMITS[key] == "max" and not value <= limit:
            if key == "violations":
                broken.append(
                    f"{percent(value)} of elements outside atol {limits.get('atol', 0):g} + rtol "
                    f"{limits.get('rtol', 0):g}*|ref| (allowed: {percent(limit)})"
                )
            else:
                broken.append(f"{key} {value:.3g} > {limit:g}")
        if ACCURACY_LIMITS[key] == "min" and not value >= limit:
            broken.append(f"{key} {value:.6g} < {limit:g}")
    return broken


def percent(share: float) -> str:
    """A share as a percentage with three significant digits, so a small one still reads: "0.000325%", "33.5%"."""
    return "0%" if share == 0 else f"{share * 100:.3g}%"


def judge(outputs: dict[str, dict[str, float]], limits: dict[str, float]) -> Judgement:
    """The stored accuracy result: per-output figures, the worst over outputs, the limits, pass or fail."""
    problems = {name: broken for name, m in outputs.items() if (broken := failures(m, limits))}
    return {
        "reference": REFERENCE,
        "outputs": outputs,
        "worst": merge(outputs.values()),
        "limits": limits,
        "pass": not problems,
        "failures": problems,
    }


@overload
def json_safe(value: dict[str, Any]) -> dict[str, Any]: ...
@overload
def json_safe(value: object) -> object: ...
def json_safe(value: object) -> object:
    """inf/NaN are not JSON: store them as strings the report prints as they are."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
