"""The failed original beside its repair: the CPU latency of fp32, of int8 without the repair and of int8 repaired,
from one interleaved run, and the honest stop on speed.

When the repair keeps layers in fp32, the int8 model it judged ``before`` (every layer int8, the repair's recipe) is
kept as a variant of the build: catalogued as its own derived model (worker/int8/stage.py) and timed by
worker/int8/choice.py in the same interleaved run as fp32 and the CPU candidates made with the kept layers. This
module turns those figures into the repair report's ``latency_ms``, ``speedup`` and, when the repaired int8 is not
faster than fp32 (the rule the candidates and the benchmark stage use: a speed-up of 1.0 or less), a ``speed_note``
with the figures and ``recommend: fp32``. Nothing here touches a file or the catalog.
"""

from __future__ import annotations

from typing import Any

from worker.measure.int8_vs_fp32 import FASTER_THAN

WHERE = "the spec's opt shapes on the quantizing worker's CPU (ONNX Runtime), one interleaved run"


def latency(cpu: dict[str, Any] | None, timed: dict[str, dict], *, kept_anything: bool) -> dict[str, Any]:
    """The repair report's latency fields, from the CPU family's quantize report (``cpu``: its kept candidate's
    ``vs_fp32`` is the int8 model as built, with the kept layers in fp32) and the figures of the models timed beside
    it (``timed["unrepaired"]``, from the same run). Without layers kept, the model as built is int8 without repair."""
    if cpu is None:
        if not kept_anything:
            return {}
        return {"latency_ms": None, "latency_note": "not timed: the build has no ONNX Runtime CPU target"}
    kept_candidate = next((c["name"] for c in cpu.get("candidates") or [] if c.get("kept")), None)
    unrepaired = timed.get("unrepaired", {"error": "not timed"}) if kept_anything else None
    vs = cpu.get("vs_fp32") or {}
    if vs.get("fp32_median_ms") is None:
        return {"latency_ms": None, "latency_note": f"not timed: {vs.get('error') or 'no CPU int8 model was timed'}"}
    fp32, built = vs["fp32_median_ms"], vs.get("int8_median_ms")
    if unrepaired is None:  # nothing kept: the model as built is int8 without repair
        return {
            "latency_ms": {"fp32": fp32, "unrepaired": built, "repaired": None},
            "speedup": {"unrepaired": vs.get("speedup"), "repaired": None},
            "latency_where": f"{WHERE}, candidate {kept_candidate}",
        }
    before = unrepaired.get("vs_fp32") or {}
    out: dict[str, Any] = {
        "latency_ms": {"fp32": fp32, "unrepaired": before.get("int8_median_ms"), "repaired": built},
        "speedup": {"unrepaired": before.get("speedup"), "repaired": vs.get("speedup")},
        "latency_where": f"{WHERE}: int8 without repair as the repair judged it, int8 repaired as candidate "
        f"{kept_candidate}",
        "faster_than_fp32": bool(vs.get("speedup") and vs["speedup"] > FASTER_THAN),
    }
    if before.get("int8_median_ms") is None:
        out["latency_note"] = f"int8 without repair not timed: {unrepaired.get('error', 'no figure')}"
    if not out["faster_than_fp32"]:
        out["recommend"] = "fp32"
        was = (
            f"; int8 without the repair {before['int8_median_ms']:.4g} ms, {before['speedup']:.2f}x"
            if before.get("int8_median_ms") is not None
            else ""
        )
        out["speed_note"] = (
            f"the repaired int8 is not faster than fp32 on this CPU: {built:.4g} ms against {fp32:.4g} ms "
            f"({vs.get('speedup', 0):.2f}x{was}): build fp32 for the CPU; a machine that accepts both is handed "
            "the faster one measured"
        )
    return out
