"""The int8 accuracy repair of a model's builds in text, from a model report's ``int8`` list (GET
/v1/models/{id}/report): the outcome, the layers kept in fp32, the cosine against fp32 before and after, the ranking
by measured sensitivity with ONNX node names, the failed original kept as a variant, the latency of fp32, int8
without repair and int8 repaired (and the note when the repaired int8 is not faster than fp32) and the CPU
candidates. The fp16 accuracy repair of a build (the report's ``fp16`` list) prints the same way, labelled fp16: the
nodes kept, the share of output elements outside the fp16 tolerance and the cosine before and after, the ranking.
``enginefarm report`` prints it after its tables; a report without a repair prints nothing more. Nothing here touches
the network."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from enginefarm.client.report import DASH, fmt_ms
from enginefarm.core.repairs import repair_groups

Report = Mapping[str, Any]


def precision_of(repair: Mapping[str, Any]) -> str:
    return repair.get("precision") or "int8"


def gate_change(repair: Mapping[str, Any]) -> str:
    """ "cosine 0.1234 (fail) -> 0.9999 (pass)"; for fp16 the share of elements outside the tolerance first."""
    before, after = repair["before"], repair["after"]
    cosine = f"cosine {before['cosine']:.4f} ({_gate(before)}) -> {after['cosine']:.4f} ({_gate(after)})"
    if precision_of(repair) != "fp16":
        return cosine
    return (
        f"outside the fp16 tolerance {share(before)} ({_gate(before)}) -> {share(after)} ({_gate(after)}) of "
        f"output elements; cosine {before['cosine']:.4f} -> {after['cosine']:.4f}"
    )


def share(figure: Mapping[str, Any]) -> str:
    """ "0.42%", the share of output elements outside the fp16 tolerance, with "(inf/NaN)" where some are."""
    return f"{100 * (figure.get('violations') or 0.0):.2f}%" + (" (inf/NaN)" if figure.get("non_finite") else "")


def outcome_line(repair: Mapping[str, Any]) -> Text:
    """ "repaired: kept shift in fp32; cosine 0.1234 (fail) -> 0.9999 (pass)", or why it was not needed or failed."""
    before = repair["before"]
    cosine = gate_change(repair)
    if not repair["needed"] and precision_of(repair) == "fp16":
        return Text(f"not needed: fp16 passes its accuracy gate as converted ({share(before)} outside the tolerance)")
    if not repair["needed"]:
        return Text(
            f"not needed: the {repair.get('recipe', 'operator')} form passes the int8 gate as quantized (cosine "
            f"{before['cosine']:.4f}); the CPU form kept was gated on its own (its candidates)"
        )
    if repair.get("form"):
        return Text.assemble(("repaired", "bold green"), f" by form: {repair['form']} passes as it is; {cosine}")
    if repair["passed"]:
        return Text.assemble(("repaired", "bold green"), f": kept {', '.join(repair['kept'])} in fp32; {cosine}")
    return Text.assemble(("repair failed", "bold red"), f": {repair.get('note') or 'nothing passed'}; {cosine}")


def _gate(figure: Mapping[str, Any]) -> str:
    return "pass" if figure["passed"] else "fail"


def ranking_table(repair: Mapping[str, Any]) -> Table:
    if precision_of(repair) == "fp16":
        return _fp16_ranking_table(repair)
    table = Table(title="sensitivity: the output's cosine against fp32 with each int8 tensor alone in float")
    for col in ("#", "ONNX nodes", "tensor", "cosine alone float", "gain", "fp32"):
        table.add_column(col, justify="right" if col in ("#", "cosine alone float", "gain") else "left")
    for i, r in enumerate(repair["ranking"], 1):
        table.add_row(
            str(i),
            ", ".join(r["layers"]),
            r["tensor"],
            f"{r['cosine_alone_float']:.4f}",
            f"{r['gain']:+.4f}",
            Text("kept", style="bold") if r["kept"] else DASH,
        )
    return table


def _fp16_ranking_table(repair: Mapping[str, Any]) -> Table:
    table = Table(
        title="sensitivity: the share of output elements outside the fp16 tolerance with each node (or region) "
        "alone in fp32"
    )
    for col in ("#", "ONNX nodes", "ops", "outside alone fp32", "cosine alone fp32", "gain", "fp32"):
        table.add_column(col, justify="left" if col in ("ONNX nodes", "ops", "fp32") else "right")
    for i, r in enumerate(repair["ranking"], 1):
        table.add_row(
            str(i),
            ", ".join(r["layers"]),
            ", ".join(r.get("ops") or []),
            f"{100 * r['violations_alone_float']:.2f}%",
            f"{r['cosine_alone_float']:.4f}",
            f"{100 * r['gain']:+.2f}%",
            Text("kept", style="bold") if r["kept"] else DASH,
        )
    return table


def latency_table(repair: Mapping[str, Any], stages: list[Mapping[str, Any]]) -> Table:
    repaired = bool(repair["kept"])
    lat, speedup = repair.get("latency_ms"), repair.get("speedup") or {}
    title = "latency, median ms" + (
        ": int8 without repair timed by the int8 stage beside fp32 and the repaired int8" if repaired else ""
    )
    table = Table(title=title)
    for col in (
        "measured by",
        "target",
        "where",
        "fp32",
        "int8 without repair",
        "int8 " + ("repaired" if repaired else "as built"),
        "speed-up",
    ):
        table.add_column(col)
    if lat:
        table.add_row(
            "int8 stage",
            "one run",
            repair.get("latency_where") or "",
            fmt_ms(lat["fp32"]),
            fmt_ms(lat.get("unrepaired")),
            fmt_ms(lat.get("repaired")),
            speedups(speedup),
        )
    for s in stages:
        for t in s["latency"]:
            if lat and t["measured_by"] == "quantize":  # the same run as the row above
                continue
            table.add_row(
                "int8 stage" if t["measured_by"] == "quantize" else "benchmark",
                s["target"],
                t["where"],
                fmt_ms(t["fp32_median_ms"]),
                "not timed" if repaired else fmt_ms(t["int8_median_ms"]),
                fmt_ms(t["int8_median_ms"]),
                f"{t['speedup']:.2f}x" if t.get("speedup") else DASH,
            )
    return table


def speedups(speedup: Mapping[str, Any]) -> str:
    """ "0.65x without repair, 0.64x repaired" from a repair's ``speedup``."""
    parts = [
        f"{speedup[k]:.2f}x {label}"
        for k, label in (("unrepaired", "without repair"), ("repaired", "repaired"))
        if speedup.get(k)
    ]
    return ", ".join(parts) or DASH


def variant_lines(repair: Mapping[str, Any]) -> list[Text]:
    """The failed original kept as a variant, and the speed stop's note, where the repair has them."""
    out = []
    if u := repair.get("unrepaired"):
        acc = u["accuracy"]
        out.append(
            Text(
                f"without repair: model {u['model_id']} version {u['version']}, cosine {acc['cosine']:.4f} "
                f"({_gate(acc)}), kept as a variant of the build (not built into engines)"
            )
        )
    if repair.get("speed_note"):
        out.append(
            Text.assemble(
                ("not faster than fp32", "bold yellow"),
                f": {repair['speed_note']} (recommended: {repair.get('recommend') or 'fp32'})",
            )
        )
    elif repair.get("latency_note"):
        out.append(Text(f"latency: {repair['latency_note']}", style="dim"))
    return out


def candidates_table(stage: Mapping[str, Any]) -> Table:
    table = Table(title=f"{stage['target']}: the CPU int8 candidates measured on the quantizing worker")
    for col in ("candidate", "speed-up", "int8 ms", "cosine", "gate", "kept"):
        table.add_column(col)
    for c in stage["candidates"]:
        if c.get("error"):
            table.add_row(c["name"], "", "", "", "did not quantize", "")
            continue
        table.add_row(
            c["name"],
            f"{c['speedup']:.2f}x" if c.get("speedup") else DASH,
            fmt_ms(c.get("int8_median_ms")),
            f"{c['cosine']:.4f}" if c.get("cosine") is not None else DASH,
            "pass" if c.get("passed") else "FAIL",
            (c.get("why") or "kept") if c.get("kept") else "",
        )
    return table


def repair_sections(report: Report) -> list[RenderableType]:
    """What ``enginefarm report`` prints for each repaired build; empty when no build ran a repair."""
    out: list[RenderableType] = []
    for g in repair_groups(report):
        repair = g["repair"]
        targets = ", ".join(s["target"] for s in g["stages"])
        head = Text(
            f"{precision_of(repair)} accuracy repair of build {g['build_id']}"
            + (f" ({g['variant']})" if g["variant"] else "")
            + f": {targets}",
            style="bold",
        )
        parts: list[RenderableType] = [head, outcome_line(repair), *variant_lines(repair)]
        if repair.get("budget"):
            what = "node(s)" if precision_of(repair) == "fp16" else "layer(s)"
            parts.append(Text(f"budget: at most {repair['budget']} {what} in fp32", style="dim"))
        if repair.get("measured_on"):
            parts.append(Text(f"measured on {repair['measured_on']}", style="dim"))
        if repair["ranking"]:
            parts.append(ranking_table(repair))
        if repair.get("latency_ms") or any(s["latency"] for s in g["stages"]):
            parts.append(latency_table(repair, g["stages"]))
        parts += [candidates_table(s) for s in g["stages"] if s["candidates"]]
        out.append(Group(*parts))
    return out
