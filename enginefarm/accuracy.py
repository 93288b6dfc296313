"""The accuracy gate: an engine's outputs against ONNX Runtime FP32 on the original model, same inputs."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from enginefarm.domain import ACCURACY_LIMITS

REFERENCE = "onnxruntime fp32 on the original model"


def metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """max abs, mean abs, relative L2 (‖c − r‖ / ‖r‖) and cosine similarity, computed in float64.

    Two all-zero tensors are identical (cosine 1, relative L2 0); NaN or inf anywhere in the candidate
    makes every metric fail rather than pass silently.
    """
    if reference.shape != candidate.shape:
        raise ValueError(f"output shapes differ: reference {list(reference.shape)}, engine {list(candidate.shape)}")
    r = np.asarray(reference, dtype=np.float64).ravel()
    c = np.asarray(candidate, dtype=np.float64).ravel()
    if r.size == 0:
        return {"max_abs": 0.0, "mean_abs": 0.0, "rel_l2": 0.0, "cosine": 1.0}
    if not np.all(np.isfinite(c)):
        return {"max_abs": math.inf, "mean_abs": math.inf, "rel_l2": math.inf, "cosine": -1.0, "non_finite": True}
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
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "rel_l2": rel, "cosine": cosine}


def merge(per_batch: Iterable[dict[str, float]]) -> dict[str, float]:
    """The worst of each metric over several batches."""
    out: dict[str, float] = {}
    for m in per_batch:
        for key, value in m.items():
            if key not in ACCURACY_LIMITS:
                continue
            worse = min if ACCURACY_LIMITS[key] == "min" else max
            out[key] = value if key not in out else worse(out[key], value)
    return out


def failures(values: dict[str, float], limits: dict[str, float]) -> list[str]:
    """Which limits these metrics break, in words; empty when they pass."""
    broken = []
    for key, limit in limits.items():
        value = values.get(key)
        if value is None:
            continue
        if ACCURACY_LIMITS[key] == "max" and not value <= limit:
            broken.append(f"{key} {value:.3g} > {limit:g}")
        if ACCURACY_LIMITS[key] == "min" and not value >= limit:
            broken.append(f"{key} {value:.6g} < {limit:g}")
    return broken


def judge(outputs: dict[str, dict[str, float]], limits: dict[str, float]) -> dict:
    """The stored accuracy result: per-output metrics, the worst over outputs, the limits, pass or fail."""
    problems = {name: broken for name, m in outputs.items() if (broken := failures(m, limits))}
    return {
        "reference": REFERENCE,
        "outputs": outputs,
        "worst": merge(outputs.values()),
        "limits": limits,
        "pass": not problems,
        "failures": problems,
    }


def json_safe(value):
    """inf/NaN are not JSON: store them as strings the report prints as they are."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
