"""What ``enginefarm ci`` writes: the JUnit XML (one case per target × check) and the Markdown summary (a table of
targets × checks and the reason of each check that did not pass), both from the gate's answer, written whole."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from typing import Any

# ------------------------------------------------------------------------------------------------ reports


def junit_xml(gate: dict[str, Any], pending: str) -> str:
    """One test case per target × check: a failure carries the reason and the numbers; a check pending on
    hardware the farm lacks is skipped when pending checks pass, a failure when they do not."""
    model = gate["model"]
    suite_name = f"enginefarm ci: {model['name']} version {model['version']}"
    cases, failures, skipped = [], 0, 0
    for target in gate["targets"]:
        for c in target["checks"]:
            case = ET.Element(
                "testcase", classname=f"enginefarm.{model['name']}", name=f"{c['target']} {c['check']}", time="0"
            )
            detail = c["reason"] + ("\n" + json.dumps(c["numbers"], indent=2, sort_keys=True) if c["numbers"] else "")
            if c["verdict"] == "fail" or (c["verdict"] == "pending" and pending == "fail"):
                failures += 1
                ET.SubElement(case, "failure", message=c["reason"], type=c["check"]).text = detail
            elif c["verdict"] == "pending":
                skipped += 1
                ET.SubElement(case, "skipped", message=c["reason"])
            else:
                ET.SubElement(case, "system-out").text = detail
            cases.append(case)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    counts = {"tests": str(len(cases)), "failures": str(failures), "errors": "0", "skipped": str(skipped)}
    root = ET.Element("testsuites", {"name": "enginefarm ci", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": suite_name, "timestamp": stamp, "time": "0", **counts})
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("model_id", model["id"]),
        ("verdict", gate["verdict"]),
        ("max_regression_pct", gate["max_regression_pct"]),
        ("pending", pending),
        ("previous_version", (gate.get("previous") or {}).get("version")),
    ):
        ET.SubElement(props, "property", name=key, value="" if value is None else str(value))
    suite.extend(cases)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


_MARK = {"pass": "✅ pass", "fail": "❌ fail", "pending": "⏳ pending"}
# The summary's column of each check, in the gate's order; "repair" is there when the run asked for one (--repair).
COLUMNS = {
    "build": "build",
    "repair": "int8 repair",
    "benchmark": "benchmark",
    "accuracy": "accuracy",
    "latency_regression": "latency vs N-1",
}
# Checks whose reason the summary lists even when they pass: they carry figures worth reading.
ALWAYS_NOTED = ("repair", "latency_regression")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _latency_cell(c: dict[str, Any]) -> str:
    shapes = [s for s in c["numbers"].get("shapes", []) if s.get("change_pct") is not None]
    if not shapes:
        return _MARK[c["verdict"]]
    worst = max(shapes, key=lambda s: s["change_pct"])
    return (
        f"{_MARK[c['verdict']]} {worst['previous_median_ms']:.3f} → {worst['median_ms']:.3f} ms "
        f"({worst['change_pct']:+.1f}%)"
    )


def markdown_summary(gate: dict[str, Any], build_id: int | None = None) -> str:
    """A table of targets × checks and the reason of every check that did not pass, for a CI job summary."""
    model, previous = gate["model"], gate.get("previous")
    head = f"### enginefarm ci: {model['name']} version {model['version']}: {gate['verdict'].upper()}"
    facts = [
        f"model {model['id']}" if model.get("id") else None,
        f"build {build_id}" if build_id else None,
        f"latency baseline: version {previous['version']}" if previous else "latency baseline: none (first version)",
        f"limit +{gate['max_regression_pct']:g}%",
        f"pending checks {gate['pending']}",
    ]
    shown = [c for c in COLUMNS if any(x["check"] == c for t in gate["targets"] for x in t["checks"])]
    repaired = {
        x["numbers"].get("precision", "int8") for t in gate["targets"] for x in t["checks"] if x["check"] == "repair"
    }
    titles = {**COLUMNS, **({"repair": f"{repaired.pop()} repair"} if len(repaired) == 1 else {})}
    lines = [
        head,
        "",
        " · ".join(f for f in facts if f),
        "",
        "| target | " + " | ".join(titles[c] for c in shown) + " |",
        "|---|" + "---|" * len(shown),
    ]
    notes = []
    for target in gate["targets"]:
        by = {c["check"]: c for c in target["checks"]}
        cells = [
            (_latency_cell(by[c]) if c == "latency_regression" else _MARK[by[c]["verdict"]]) if c in by else "–"
            for c in shown
        ]
        lines.append(f"| `{target['target']}` | " + " | ".join(cells) + " |")
        notes += [
            f"- `{c['target']}` {c['check']}: {_cell(c['reason'])}"
            for c in target["checks"]
            if c["verdict"] != "pass" or c["check"] in ALWAYS_NOTED
        ]
    counts = gate["counts"]
    lines += ["", f"{counts['pass']} passed, {counts['fail']} failed, {counts['pending']} pending."]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n\n"
