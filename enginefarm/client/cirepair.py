"""``enginefarm ci --repair``: the accuracy repair as one more check of every target, read from the build's int8
stage, or its fp16 repair stage (``quantize.reports.<family>.repair`` of GET /v1/builds/{id}). It passes when the
repair was not needed or reached a passing gate, and fails with the repair's own reason otherwise. Where no set of
layers within the budget repairs the recipe judged, the repair judges the other CPU forms (whole kinds of layer kept
in float) and passes with the first that passes as it is, saying so (``form``); a build none of whose forms passes
fails the run. A repaired int8 that is not faster than fp32 on the CPU passes, with the repair's figures and
recommendation in the reason."""

from __future__ import annotations

from typing import Any

from enginefarm.core.domain import FP16_REPAIR_STAGE

REPAIR = "repair"


def repair_verdict(build: dict[str, Any] | None) -> tuple[str, str, dict[str, Any]]:
    """(pass or fail, the reason, the figures) of the build's repair."""
    if build is None:
        return "fail", "no build: nothing was repaired", {}
    stage = build.get("quantize") or {}
    if not stage:
        return (
            "fail",
            "the build has no int8 or fp16 repair stage: the repair applies to int8 built from calibration "
            "samples and to fp16",
            {},
        )
    name = "fp16 repair stage" if stage.get("kind") == FP16_REPAIR_STAGE else "int8 stage"
    if stage.get("state") == "failed":
        return "fail", f"the {name} failed: {stage.get('error') or 'no reason recorded'}", {}
    repair = next((r["repair"] for r in (stage.get("reports") or {}).values() if r.get("repair")), None)
    if stage.get("state") != "succeeded" or repair is None:
        why = "no repair recorded" if stage.get("state") == "succeeded" else f"state {stage.get('state')}"
        return "fail", f"the {name} did not finish a repair: {why}", {}
    if repair.get("precision") == "fp16":
        return _fp16_verdict(repair)
    before, after = repair["before"], repair["after"]
    numbers = {
        **_numbers(repair, "cosine_alone_float"),
        **{k: repair[k] for k in ("latency_ms", "speedup", "faster_than_fp32", "recommend") if k in repair},
        **({"unrepaired_model_id": repair["unrepaired"]["model_id"]} if repair.get("unrepaired") else {}),
    }
    cosine = f"cosine {before['cosine']:.4f} -> {after['cosine']:.4f} against fp32"
    if not repair["needed"]:
        return (
            "pass",
            f"not needed: int8 passes its accuracy gate as quantized (cosine {before['cosine']:.4f})",
            numbers,
        )
    if repair.get("form"):
        numbers["form"] = repair["form"]
        return "pass", f"repaired by form: {repair.get('note')}", numbers
    if repair["passed"]:
        note = repair.get("speed_note")
        slower = f"; {note} (recommended: {repair.get('recommend')})" if note else ""
        return "pass", f"repaired: kept {', '.join(repair['kept'])} in fp32; {cosine}{slower}", numbers
    return "fail", f"repair failed: {repair.get('note') or 'no set of layers within the budget passes'}", numbers


def _numbers(repair: dict[str, Any], alone: str) -> dict[str, Any]:
    """The figures of a repair every precision has, its five most sensitive layers by their figure ``alone``."""
    return {
        "needed": repair["needed"],
        "passed": repair["passed"],
        "kept": repair["kept"],
        "cosine_before": repair["before"]["cosine"],
        "cosine_after": repair["after"]["cosine"],
        "budget": repair.get("budget"),
        "ranking": [{"layers": r["layers"], alone: r[alone]} for r in repair.get("ranking", [])[:5]],
    }


def _fp16_verdict(repair: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    from enginefarm.client.terminal import fp16_change

    numbers = {
        **_numbers(repair, "violations_alone_float"),
        "precision": "fp16",
        "violations_before": repair["before"].get("violations"),
        "violations_after": repair["after"].get("violations"),
    }
    if not repair["needed"]:
        return "pass", f"not needed: fp16 passes its accuracy gate as converted ({fp16_change(repair)})", numbers
    if repair["passed"]:
        return "pass", f"repaired: kept {', '.join(repair['kept'])} in fp32; {fp16_change(repair)}", numbers
    return "fail", f"repair failed: {repair.get('note') or 'no set of nodes within the budget passes'}", numbers


def with_repair(gate: dict[str, Any], build: dict[str, Any] | None) -> dict[str, Any]:
    """The gate with the repair's check after each target's build check; its verdict, counts and reason redone."""
    verdict, reason, numbers = repair_verdict(build)
    precision = numbers.get("precision", "int8")
    for target in gate["targets"]:
        check = {
            "target": target["target"],
            "check": REPAIR,
            "verdict": verdict,
            "in_progress": False,
            "numbers": numbers,
            "reason": reason,
        }
        at = next((i + 1 for i, c in enumerate(target["checks"]) if c["check"] == "build"), 0)
        target["checks"].insert(at, check)
        if verdict == "fail":
            target["verdict"] = "fail"
    recount(gate, failed=verdict == "fail")
    if verdict != "fail" and gate["targets"]:
        gate["reason"] += f"; {precision} {reason}"
    return gate


def recount(gate: dict[str, Any], failed: bool) -> dict[str, Any]:
    """The gate with its counts redone from its checks and, where ``failed``, its verdict fail and every failed check
    in its reason."""
    every = [c for t in gate["targets"] for c in t["checks"]]
    gate["counts"] = {v: sum(c["verdict"] == v for c in every) for v in ("pass", "fail", "pending")}
    if failed:
        bad = [c for c in every if c["verdict"] == "fail"]
        gate["verdict"] = "fail"
        gate["reason"] = f"{len(bad)} check(s) failed: " + "; ".join(
            f"{c['target']} {c['check']}: {c['reason']}" for c in bad
        )
    return gate
