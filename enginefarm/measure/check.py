"""An engine's accuracy check against reference outputs: the farm's worker and a deploy machine run this same code.

The reference is ONNX Runtime FP32 on the original model, run by the farm (worker/measure/evaluate.py) on the
check's inputs: the model's samples, else seeded random inputs at the opt shapes. ``Reference`` holds those inputs
and outputs; the farm keeps them as one ``.npz`` blob per distinct set (``save``), and serves them to deploy
machines (``GET /v1/engines/{id}/reference``), which ``load`` them and ``compare`` with no fp32 pass of their own.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from enginefarm.measure import accuracy

FORMAT = "enginefarm-reference/1"
MAX_ARRAYS = 4096  # a reference file naming more arrays than this is not one the farm wrote


class Inferring(Protocol):
    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class BadReference(ValueError):
    """A reference file that is not what the farm writes."""


@dataclass
class Reference:
    """What an accuracy check feeds the engine (fixed inputs left out) and what the reference answered, per batch."""

    feeds: list[dict[str, np.ndarray]]
    wanted: list[dict[str, np.ndarray]]
    names: list[str]  # the reference's outputs, in order
    origin: str  # where the inputs came from, in words

    def save(self, path: Path) -> None:
        """One ``.npz`` (no pickles): array ``f{batch}_{i}`` is input ``inputs[i]``, ``w{batch}_{j}`` output
        ``names[j]``; the names and the origin are in the JSON array ``meta``."""
        inputs = sorted({n for feed in self.feeds for n in feed})
        meta = {"format": FORMAT, "inputs": inputs, "names": self.names, "origin": self.origin, "batches": 0}
        arrays: dict[str, np.ndarray] = {}
        for b, (feed, want) in enumerate(zip(self.feeds, self.wanted, strict=True)):
            arrays |= {f"f{b}_{i}": np.asarray(feed[n]) for i, n in enumerate(inputs) if n in feed}
            arrays |= {f"w{b}_{j}": np.asarray(want[n]) for j, n in enumerate(self.names)}
            meta["batches"] = b + 1
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with path.open("wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: Path) -> Reference:
        """A reference file as the farm wrote it; ``BadReference`` says what is wrong with any other."""
        try:
            with np.load(path, allow_pickle=False) as z:
                if len(z.files) > MAX_ARRAYS or "meta" not in z.files:
                    raise BadReference("not an enginefarm reference file (no meta array)")
                meta = json.loads(bytes(z["meta"]).decode())
                if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                    raise BadReference(f"reference format {meta.get('format')!r}, this client reads {FORMAT}")
                inputs, names, batches = list(meta["inputs"]), list(meta["names"]), int(meta["batches"])
                feeds, wanted = [], []
                for b in range(batches):
                    feeds.append({n: z[f"f{b}_{i}"] for i, n in enumerate(inputs) if f"f{b}_{i}" in z.files})
                    wanted.append({n: z[f"w{b}_{j}"] for j, n in enumerate(names)})
                return cls(feeds, wanted, names, str(meta["origin"]))
        except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
            if isinstance(exc, BadReference):
                raise
            raise BadReference(f"not a readable reference file: {exc}") from exc


def compare(runner: Inferring, ref: Reference, limits: dict[str, float]) -> dict[str, Any]:
    """The engine's outputs on the reference's inputs against the reference's outputs, judged under ``limits``
    (``accuracy.judge``'s result, a plain dict the callers extend)."""
    return judge([runner.infer(feed) for feed in ref.feeds], ref, limits)


def judge(outputs: list[dict[str, Any]], ref: Reference, limits: dict[str, float]) -> dict[str, Any]:
    """``compare`` on outputs already computed, one dict per reference feed."""
    per_output: dict[str, list[dict[str, float]]] = {n: [] for n in ref.names}
    atol, rtol = limits.get("atol"), limits.get("rtol")
    for got, want in zip(outputs, ref.wanted, strict=True):
        for name in ref.names:
            if name not in got:
                raise ValueError(f"the engine has no output {name!r} (it has {', '.join(got)})")
            per_output[name].append(accuracy.metrics(want[name], got[name], atol, rtol))
    return cast("dict[str, Any]", accuracy.judge({n: accuracy.merge(m) for n, m in per_output.items()}, limits))


def verdict(runner: Inferring, ref: Reference, limits: dict[str, float], precision: str) -> dict[str, Any]:
    """The check as the farm records it: ``compare``, and for an fp32 artifact run with TF32 that misses the fp32
    limits, the same again with TF32 off (``tf32_verdict``); then the inputs' origin and the precision."""
    result = compare(runner, ref, limits)
    if not result["pass"] and precision == "fp32" and hasattr(runner, "without_tf32"):
        result = tf32_verdict(result, runner, ref, limits)
    result.update(inputs=ref.origin, precision=precision)
    return cast("dict[str, Any]", accuracy.json_safe(result))


def tf32_verdict(result: dict[str, Any], runner: Any, ref: Reference, limits: dict[str, float]) -> dict[str, Any]:
    """An fp32 artifact run with TF32 that misses the fp32 limits is run again with TF32 off, on the same GPU and
    inputs. If it then passes, the differences are what TF32's 10-bit mantissa explains: the verdict passes and
    says so, with both sets of figures. If it fails without TF32 too, the error is real and the verdict fails."""
    exact = runner.without_tf32()
    if exact is None:
        return result
    try:
        off = compare(exact, ref, limits)
    finally:
        exact.close()
    worst_on, worst_off = result["worst"], off["worst"]
    summary = {
        "worst_with_tf32": worst_on,
        "worst_without_tf32": worst_off,
        "pass_without_tf32": off["pass"],
        "outputs_without_tf32": off["outputs"],
    }
    if not off["pass"]:
        return {
            **off,
            "tf32": {
                **summary,
                "explains": False,
                "note": "fails with TF32 off as well: the differences are not TF32's",
            },
        }
    note = (
        f"differences beyond the fp32 limits are TF32's: with TF32 on, max abs "
        f"{worst_on.get('max_abs', 0):.3g}; with TF32 off on the same GPU and inputs, "
        f"{worst_off.get('max_abs', 0):.3g}, within the limits"
    )
    return {
        **result,
        "pass": True,
        "failures": {},
        "explained_by": "tf32",
        "tf32": {**summary, "explains": True, "failures_with_tf32": result["failures"], "note": note},
    }
