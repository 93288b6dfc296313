"""Resolve, orchestrated: the question's tag, the kept answer or 304, the engines judged, the answer, a build.

``resolve(req, ...)`` is the one service function behind GET and POST /v1/resolve. In order, each step only when
the one before could not answer:

1. the versions the question names, with their generations, make the ETag; a client holding it gets a 304;
2. the answer kept under the tag (``api.services.answers``) is sent as it is;
3. the engines of those versions are judged and ranked for the machine (``enginefarm.core.choose``), kind by kind
   where possible (``by_kind``), from compiled tables kept per catalog state (``Tables``), and the answer is kept;
4. when nothing fits: a 404 that says why per engine and what would fit, or with ``build`` the build (202).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

from api.metrics import RESOLVES, labelled
from api.schemas import EngineOut
from api.schemas.resolve import BuildForMachineOut, CandidateOut, CheckOut, MeasuredOut, ResolveOut, ResolveRequest
from api.services import machinebuilds
from api.services.answers import Answers, Known, digest_of, etag_of, matches
from api.services.versions import Versions
from enginefarm.core.choose import (
    Choice,
    Evidence,
    Judged,
    Option,
    choose,
    figures_for,
    judged_by_kind,
    kind_rules,
)
from enginefarm.core.config import Settings
from enginefarm.core.errors import NoCompatibleEngine, SpecInvalid
from enginefarm.core.machine import Machine
from enginefarm.core.verdicts import Match
from storage import resolution
from storage.resolution import EngineTable, KindTable
from storage.tokens import Principal


@dataclass
class Outcome:
    """What to answer: ``status`` 200 with ``body`` (JSON bytes), 304 with none, or 202 with ``body``; ``tag``
    is the ETag of a 200 or 304."""

    status: int
    body: bytes = b""
    tag: str | None = None


class Tables:
    """Compiled engine tables by their ``key`` (project, version ids and generations; with the engines' ids for a
    table of some of them, and marked for a KindTable), at most ``entries`` of them (least recently used out). A key
    names one state of the catalog: a change makes a new key, and the old table falls out."""

    def __init__(self, entries: int = 64):
        self.entries = entries
        self._tables: OrderedDict[tuple, EngineTable | KindTable] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Any:
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
            return table

    def put(self, table: EngineTable | KindTable) -> None:
        if self.entries <= 0:
            return
        with self._lock:
            self._tables[table.key] = table
            while len(self._tables) > self.entries:
                self._tables.popitem(last=False)


def table_of(
    session: Session, tables: Tables, owner: dict[str, Row], ids: tuple[int, ...] | None = None
) -> EngineTable:
    key = resolution.table_key(owner)
    table = tables.get(key if ids is None else (key, ids))
    if table is None:
        table = resolution.engine_table(session, owner, ids)
        tables.put(table)
    return table


def by_kind(
    session: Session, tables: Tables, owner: dict[str, Row], machine: Machine, req: ResolveRequest
) -> tuple[EngineTable, Choice, Counter[str]] | None:
    """Judge the model's engines kind by kind: a kind that cannot run here (or that a filter refuses) is counted
    under its rule without reading its engines, and only the engines of the other kinds are read and judged. The
    same choice, ranking and counts as judging every engine (``tests/e2e/api/test_resolve_by_kind.py``); None where
    every engine must be judged: ``explain``, a build, a filter on an engine's own facts, and an answer where
    nothing runs (the 404 says why per engine)."""
    if req.explain or req.build or not judged_by_kind(req):
        return None
    key = ("kinds", resolution.table_key(owner))
    kinds = tables.get(key)
    if kinds is None:
        kinds = resolution.kind_table(session, owner)
        tables.put(kinds)
    excluded: Counter[str] = Counter()
    ids: list[int] = []
    for rule, engines in zip(kind_rules(kinds.kinds, kinds.describe, machine, req), kinds.ids):
        if rule is not None:
            excluded[rule.value] += len(engines)
        else:
            ids += engines
    if not ids:
        return None
    table = table_of(session, tables, owner, tuple(sorted(ids)))
    choice = judge(table, machine, req)
    if choice.chosen is None:
        return None
    excluded.update(rule.value for j in choice.rejected if (rule := j.verdict.rule))
    return table, choice, excluded


def judge(table: EngineTable, machine: Machine, req: ResolveRequest) -> Choice:
    """Judge and rank the table's engines for this machine and these filters. The compiled facts are shared; the
    options and their evidence are this request's (ranking writes the latency it compared into the evidence)."""
    options = [
        Option(f.id, f.descriptor, f.model_seq, f.spec_hash, Evidence(f.accuracy, f.latencies, f.shapes, f.machines))
        for f in table.facts
    ]
    return choose(options, machine, req, checks=req.explain)


def _candidate(j: Judged, rows: dict[int, Row], owner: dict[str, Row], explain: bool) -> CandidateOut:
    row, v, ev = rows[j.option.id], j.verdict, j.option.evidence
    return CandidateOut(
        engine_id=row.id,
        target=row.target,
        model_version=owner[row.model_sha256].version,
        precision=row.precision,
        spec_hash=row.spec_hash,
        rank=j.rank,
        match=v.match.label if v.match is not None else None,
        rule=v.rule.value if v.rule else None,
        reason=v.reason,
        unchecked=v.unchecked,
        accuracy=ev.accuracy,
        latency_ms=ev.latency_ms,
        latency_on=ev.latency_on,
        profiles=j.option.engine.profiles,
        checks=[CheckOut(**c.to_dict()) for c in v.checks] if explain else None,
    )


def no_fit_error(choice: Choice, rows: dict[int, Row], model: str, version: str | None) -> NoCompatibleEngine:
    what = model + (f" version {version}" if version else "")
    if not rows:
        return NoCompatibleEngine(f"no engines of {what} are built yet")
    runs = (
        f"only the CPU artifact of {what} runs" if choice.ranked else f"none of the {len(rows)} engines of {what} runs"
    )
    return NoCompatibleEngine(
        f"{runs} on this machine",
        problems=[
            {
                "engine_id": j.option.id,
                "target": rows[j.option.id].target,
                "precision": rows[j.option.id].precision,
                "rule": j.verdict.rule,
                "reason": j.verdict.reason,
            }
            for j in choice.rejected
        ],
    )


def shapes_problem(table: resolution.EngineTable, shapes: dict[str, dict[str, list[int]]]) -> str | None:
    """Why the shapes asked cannot be the model's: an input no engine's profiles name, or dims of another rank (a
    422, not "no engine fits", since no build would fit them either); None where the profiles are not recorded."""
    inputs: dict[str, int] = {}  # name -> rank, from every engine's profiles
    for f in table.facts:
        for profile in f.descriptor.profiles or []:
            inputs.update({name: len(rng["min"]) for name, rng in profile.items()})
    if not inputs:
        return None
    known = ", ".join(f"{n} (rank {r})" for n, r in sorted(inputs.items()))
    for name, want in shapes.items():
        if name not in inputs:
            return f"shapes: the model has no input {name!r}; its inputs are {known}"
        if len(want["min"]) != inputs[name]:
            return f"shapes: input {name!r} has rank {inputs[name]}, you gave {len(want['min'])} dims; inputs: {known}"
    return None


def resolve(
    req: ResolveRequest,
    session: Session,
    settings: Settings,
    principal: Principal,
    *,
    answers: Answers,
    versions: Versions,
    tables: Tables,
    if_none_match: str | None = None,
    query: bytes | None = None,
) -> Outcome:
    """Answer one resolve question (see the module's docstring). ``query``: a GET's query string, remembered so the
    fleet's path (``api.http.fastpath.FleetPath``) answers it next time before routing. Raises NoCompatibleEngine (404),
    NotFound or Conflict for the model."""
    project = principal.project
    machine = req.machine
    stamp = versions.stamp()  # the full path always reads the versions; the fleet's path may use what it keeps
    models = resolution.model_versions(session, req.model, req.version, project)
    versions.put((req.model, req.version, project), models, stamp)
    digest = digest_of(req)
    tag = etag_of(digest, project, models)

    def answered(outcome: Outcome) -> Outcome:
        if query is not None:  # every answer from here on, kept or not: the fleet's path has it from now on
            answers.remember(query, project, Known(req.model, req.version, digest))
        return outcome

    if matches(if_none_match, tag):
        labelled(RESOLVES, "not_modified").inc()
        return answered(Outcome(304, tag=tag))
    if (kept := answers.get(tag)) is not None:
        labelled(RESOLVES, kept[1]).inc()
        return answered(Outcome(200, kept[0], tag))
    owner = resolution.owners(models)
    if (kinds := by_kind(session, tables, owner, machine, req)) is not None:
        table, choice, excluded = kinds
    else:
        table = table_of(session, tables, owner)
        choice = judge(table, machine, req)
        excluded = Counter(rule.value for j in choice.rejected if (rule := j.verdict.rule))
    rows = table.rows
    chosen = choice.chosen
    # A GPU machine that asks for a build wants a GPU engine: the CPU artifact does not stop it.
    only_cpu = chosen is not None and chosen.verdict.match is Match.CPU_FALLBACK and machine.compute_capability
    if chosen is None or (req.build and only_cpu):
        if machine.shapes and (wrong := shapes_problem(table, machine.shapes)):
            raise SpecInvalid(wrong, problems=[{"loc": ["shapes"], "msg": wrong}])
        error = no_fit_error(choice, rows, req.model, req.version)
        labelled(RESOLVES, "build" if req.build else "no_fit").inc()
        if not req.build:
            error.context["build"] = fit = machinebuilds.what_would_fit(req)
            if fit["command"]:
                error.message += f"; an engine for it would be {' or '.join(fit['targets'])}: {fit['command']}"
            raise error
        fallback = _candidate(chosen, rows, owner, False) if chosen else None
        session.rollback()  # release the read transaction before the build writes
        built = machinebuilds.build_for_machine(
            settings,
            req.model,
            req.version,
            machine,
            spec_hash=req.spec_hash,
            precision=req.precision,
            project=project,
            token_id=principal.family_id,
        )
        accepted = BuildForMachineOut(**built, reasons=error.problems, fallback=fallback)
        return Outcome(202, accepted.model_dump_json().encode())
    explain = req.explain
    ranked = [_candidate(j, rows, owner, explain) for j in choice.ranked]
    rejected = [_candidate(j, rows, owner, explain) for j in choice.rejected] if explain else None
    match = chosen.verdict.match
    assert match is not None  # a ranked engine runs, and the verdict of one that runs has its match
    engine, version, variant_of, verdict = resolution.chosen_engine(session, table, chosen.option.id, owner, models)
    out = ResolveOut(
        model=req.model,
        machine=req.machine,
        engine=EngineOut.of(engine, version, variant_of=variant_of, verdict=verdict),
        ranked_by=choice.ranked_by,
        match=match.label,
        reason=chosen.verdict.reason,
        unchecked=chosen.verdict.unchecked,
        accuracy=chosen.option.evidence.accuracy or "unchecked",
        download_url=f"/v1/engines/{chosen.option.id}/content",
        fallbacks=ranked[1:],
        excluded=dict(sorted(excluded.items())),
        rejected=rejected,
        candidates=None if rejected is None else ranked + rejected,  # rejected is a list with explain only
        measured=[MeasuredOut(**dataclasses.asdict(f)) for f in figures_for(chosen.option.evidence, machine)],
    )
    body = out.model_dump_json().encode()
    answers.put(tag, body, out.match, (digest, project))
    labelled(RESOLVES, out.match).inc()
    return answered(Outcome(200, body, tag))
