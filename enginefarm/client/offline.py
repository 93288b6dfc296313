"""Resolution without the farm: the engines in the local cache judged by the farm's own rules
(``enginefarm.core.choose``), for ``enginefarm fetch --offline`` and a deploy machine that cannot reach the farm."""

from __future__ import annotations

from typing import Any

from enginefarm.client.cache import EngineCache
from enginefarm.core.choose import Evidence, Judged, Option, choose
from enginefarm.core.domain import EngineDescriptor
from enginefarm.core.errors import NoCompatibleEngine
from enginefarm.core.machine import Machine
from enginefarm.core.wanted import Wanted

# An engine record's accuracy_pass (true, false or absent) as a verdict.
_ACCURACY_OF: dict[Any, str] = {True: "pass", False: "fail"}


def query_filters(filters: dict[str, Any], allow_cpu: bool) -> dict[str, Any]:
    """A resolve's filters as its query sends them: those given, sets as sorted lists; with ``allow_cpu``, ``accept``
    also takes an ONNX Runtime artifact on a GPU machine (``accept: cpu``)."""
    if allow_cpu:
        filters = {**filters, "accept": sorted(set(filters.get("accept") or ()) | {"cpu"})}
    return {k: sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in filters.items() if v is not None}


def resolve_offline(
    cache: EngineCache,
    model: str,
    machine: Machine,
    *,
    version: str | None = None,
    allow_cpu: bool = False,
    **filters: Any,
) -> dict[str, Any]:
    """Resolve from the engines in the local cache alone, with the farm's own rules; the answer has the
    shape of /v1/resolve's (engine, match, reason, fallbacks, rejected). Raises NoCompatibleEngine."""
    records = {
        r["sha256"]: r
        for r in cache.records(model, None if version == "latest" else version)
        if cache.has(r["sha256"], verify=False)
    }
    if version == "latest" and records:
        newest = max(r.get("model_seq", 0) for r in records.values())
        records = {k: r for k, r in records.items() if r.get("model_seq", 0) == newest}
    options = [
        Option(
            sha,
            EngineDescriptor.of(r),
            r.get("model_seq", 0),
            r.get("spec_hash", ""),
            Evidence(accuracy=_ACCURACY_OF.get(r.get("accuracy_pass"))),
        )
        for sha, r in records.items()
    ]
    choice = choose(options, machine, Wanted.model_validate(query_filters(filters, allow_cpu)))

    def row(j: Judged) -> dict[str, Any]:
        r, v = records[j.option.id], j.verdict
        return {
            "engine_id": r.get("id"),
            "target": r["target"],
            "model_version": r.get("model_version"),
            "precision": r.get("precision"),
            "rank": j.rank,
            "match": v.match.label if v.match is not None else None,
            "rule": v.rule.value if v.rule else None,
            "reason": v.reason,
            "unchecked": v.unchecked,
            "accuracy": j.option.evidence.accuracy,
            "profiles": r.get("profiles") or [],
            "checks": [c.to_dict() for c in v.checks],
        }

    if choice.chosen is None:
        what = f"{model}" + (f" version {version}" if version else "")
        raise NoCompatibleEngine(
            f"none of the {len(records)} cached engines of {what} runs on this machine"
            if records
            else f"no engines of {what} in the cache at {cache.root}",
            problems=[row(j) for j in choice.rejected],
        )
    best = choice.chosen
    match = best.verdict.match.label if best.verdict.match is not None else None  # a chosen engine has one
    return {
        "engine": records[best.option.id],
        "match": match,
        "reason": best.verdict.reason,
        "unchecked": best.verdict.unchecked,
        "accuracy": best.option.evidence.accuracy or "unchecked",
        "fallbacks": [row(j) for j in choice.ranked[1:]],
        "rejected": [row(j) for j in choice.rejected],
        "candidates": [row(j) for j in choice.ranked + choice.rejected],
        "offline": True,
    }
