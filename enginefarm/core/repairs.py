"""The accuracy repairs in a model report (GET /v1/models/{id}/report: its ``int8`` and ``fp16`` lists), grouped by
build: a repair is found once for all of a build's targets. The dashboard's report page and ``enginefarm report``
both show them this way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def repair_groups(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per build whose int8 stage ran a repair, or that ran an fp16 repair: build_id, variant, repair, and
    the stages of that build's engines."""
    variants = {r.get("engine_id"): r.get("variant") for r in report.get("rows") or []}
    out: dict[int, dict[str, Any]] = {}
    for stage in [*(report.get("int8") or []), *(report.get("fp16") or [])]:
        if stage.get("repair"):
            group = out.setdefault(
                stage["build_id"],
                {
                    "build_id": stage["build_id"],
                    "variant": variants.get(stage["engine_id"]),
                    "repair": stage["repair"],
                    "stages": [],
                },
            )
            group["stages"].append(stage)
    return list(out.values())
