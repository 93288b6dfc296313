"""Resolution's reads: the versions a request names, and the facts of their engines with what an answer says of
the chosen one.

This is /v1/resolve's hot path, so it reads plain rows of only the columns resolution uses: no ORM objects, no
JSON it parses unless it is used (a verdict's metrics are parsed for the chosen engine only; a model's graph facts
are not read), and the engines, their verdicts and their best latencies (an aggregate, not every benchmark row) in
one statement, on the session's connection (Core statements built once). The engines come back compiled
(``EngineTable``: descriptors and evidence, ready to judge, and the rows an answer's engine is made from), keyed by
what they are a function of, so the API may keep them. Judging and answering are ``api.services.resolve``'s;
this module only reads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import Row, Text, and_, bindparam, cast, func, select
from sqlalchemy.orm import Session

from enginefarm.core.compat import KIND_FACTS
from enginefarm.core.domain import ENGINE_FACTS, JSON_FACTS, EngineDescriptor
from enginefarm.core.fleet import class_figures
from enginefarm.core.shapes import shapes_key
from enginefarm.core.spec import DEFAULT_SHAPE_KEY
from storage import fleet
from storage.catalog import find_models, latest_of
from storage.db import json_loads
from storage.driverrows import driver_rows
from storage.tables import BenchmarkRow, EngineRow, ModelRow, VerdictRow

# What an answer says about a model version, and what its ETag is made of.
MODEL_COLUMNS = (
    ModelRow.id,
    ModelRow.project,
    ModelRow.name,
    ModelRow.version,
    ModelRow.seq,
    ModelRow.sha256,
    ModelRow.source_model_id,
    ModelRow.generation,
)
# What judging, ranking and a candidate's line need of an engine: its facts, and the project's verdict (the id, the
# model's sha and the spec hash first and the verdict last: compiling reads them by position).
# The JSON facts come as their text, cheaper than the driver's JSON loading: compiling parses each distinct text once.
ENGINE_COLUMNS = (
    EngineRow.id,
    EngineRow.model_sha256,
    EngineRow.spec_hash,
    *(
        cast(getattr(EngineRow, name), Text).label(name) if name in JSON_FACTS else getattr(EngineRow, name)
        for name in ENGINE_FACTS
    ),
    VerdictRow.accuracy_pass,
)


def model_versions(session: Session, model: str, version: str | None, project: str | None) -> list[Any]:
    """The model rows a request names (plain rows of MODEL_COLUMNS, as ``driver_rows`` returns them): one version,
    the newest with "latest", or every version. Raises NotFound or Conflict as ``find_models`` does."""
    rows = find_models(session, model, None if version == "latest" else version, project, columns=MODEL_COLUMNS)
    return latest_of(rows) if version == "latest" else rows


def owners(models: list[Row]) -> dict[str, Row]:
    """The version each model sha's engines are listed under: identical bytes under another name share them, and
    the newest version holding the bytes owns them."""
    owner: dict[str, Row] = {}
    for m in models:
        if m.sha256 not in owner or m.seq > owner[m.sha256].seq:
            owner[m.sha256] = m
    return owner


def descriptor_of(row) -> EngineDescriptor:
    """An engine's descriptor from its row (an EngineRow or a plain row of ENGINE_COLUMNS)."""
    return EngineDescriptor.of(row)


_FACTS = slice(3, 3 + len(ENGINE_FACTS))  # where ENGINE_COLUMNS holds the facts

# What an answer says of its engine beyond judging (``EngineOut``): how it was built, and whether the asking project
# checked it and with what metrics. Read with every engine, so the chosen one needs no statement of its own; the
# metrics as their JSON text, parsed only for the engine chosen.
ANSWER_COLUMNS = (
    EngineRow.build_seconds,
    EngineRow.built_by,
    EngineRow.created_at,
    VerdictRow.id.label("verdict_id"),
    cast(VerdictRow.accuracy, Text).label("verdict_accuracy"),
)


# The project's best median latency at the default shape of each engine, per device it was measured on: one
# aggregate, joined to the engines below; of the engines of these bytes, or of these engines.
def _best(of_ids: bool):
    engines = (
        BenchmarkRow.engine_id.in_(bindparam("ids", expanding=True))
        if of_ids
        else EngineRow.model_sha256.in_(bindparam("shas", expanding=True))
    )
    query = select(
        BenchmarkRow.engine_id,
        BenchmarkRow.gpu_name,
        BenchmarkRow.compute_capability,
        BenchmarkRow.cpu_name,
        cast(BenchmarkRow.shapes, Text).label("shapes"),
        func.min(BenchmarkRow.median_ms).label("median_ms"),
    )
    if not of_ids:
        query = query.join(EngineRow, EngineRow.id == BenchmarkRow.engine_id)
    return (
        query.where(engines, BenchmarkRow.shape_key == DEFAULT_SHAPE_KEY, BenchmarkRow.project == bindparam("project"))
        .group_by(
            BenchmarkRow.engine_id,
            BenchmarkRow.gpu_name,
            BenchmarkRow.compute_capability,
            BenchmarkRow.cpu_name,
            cast(BenchmarkRow.shapes, Text),
        )
        .subquery("best")
    )


def _engines_of(of_ids: bool):
    best = _best(of_ids)
    engines = (
        EngineRow.id.in_(bindparam("ids", expanding=True))
        if of_ids
        else EngineRow.model_sha256.in_(bindparam("shas", expanding=True))
    )
    measured = (
        best.c.gpu_name.label("measured_gpu"),
        best.c.compute_capability.label("measured_cc"),
        best.c.cpu_name.label("measured_cpu"),
        best.c.shapes.label("measured_shapes"),
        best.c.median_ms.label("measured_ms"),
    )
    return (
        select(*ENGINE_COLUMNS, *ANSWER_COLUMNS, *measured)
        .outerjoin(VerdictRow, and_(VerdictRow.engine_id == EngineRow.id, VerdictRow.project == bindparam("project")))
        .outerjoin(best, best.c.engine_id == EngineRow.id)
        .where(engines)
        .order_by(EngineRow.model_sha256, EngineRow.spec_hash, EngineRow.target, EngineRow.backend_version)
    )


# Built once: a statement's construction costs more than its compiled form's cache lookup. The verdict joined is
# the asking project's own: another project's check of the same bytes never decides what this one is handed. One
# row per engine and device class it was measured on (one with nulls when never measured), in the order of the
# engines' build key (the unique index the engines are found by), so an engine's rows come together and the
# engines in the same order every time. ENGINES_OF: every engine of the bytes; ENGINES_BY_ID: the ones named.
ENGINES_OF = _engines_of(of_ids=False)
ENGINES_BY_ID = _engines_of(of_ids=True)


# The kinds of engine of these bytes (KIND_FACTS: all but an engine's own bytes, size, memory and profiles), each
# with the ids of its engines: a machine judges a kind once, and reads only the engines of the kinds that may run
# on it (``kind_table``). A model's 100 engines are a few dozen kinds, grouped by the one column each engine's
# kind key is written in (``compat.kind_key``); a kind's facts are read once per process (KIND_FACTS_OF), since
# the same kinds recur across models.
def _kinds_of(ids):
    shas = EngineRow.model_sha256.in_(bindparam("shas", expanding=True))
    return select(EngineRow.kind_key, ids).where(shas).group_by(EngineRow.kind_key)


KINDS_OF = {
    "postgresql": _kinds_of(func.array_agg(EngineRow.id)),  # a list of ints
    "sqlite": _kinds_of(func.group_concat(EngineRow.id, ",")),  # their text
}
KIND_COLUMNS = tuple(
    cast(getattr(EngineRow, name), Text).label(name) if name in JSON_FACTS else getattr(EngineRow, name)
    for name in KIND_FACTS
)
# The facts of these kinds, from these bytes' engines (a kind's engines all have the same; one row a kind).
KIND_FACTS_OF = (
    select(EngineRow.kind_key, *KIND_COLUMNS)
    .where(
        EngineRow.model_sha256.in_(bindparam("shas", expanding=True)),
        EngineRow.kind_key.in_(bindparam("keys", expanding=True)),
    )
    .group_by(EngineRow.kind_key, *KIND_COLUMNS)
)


# Where an ENGINES_OF row holds what compiling reads (positions: a row's attributes by name cost more, per row).
_PASSED = len(ENGINE_COLUMNS) - 1
_JSON_AT = tuple(ENGINE_FACTS.index(name) for name in JSON_FACTS)  # within _FACTS
_MEASURED = slice(len(ENGINE_COLUMNS) + len(ANSWER_COLUMNS), None)
_ACCURACY = {None: None, True: "pass", False: "fail"}


def _add_latency(
    latencies: dict[str, float],
    shapes: dict[str, str],
    measured: tuple[str | None, str | None, str | None, str | None, float],
) -> None:
    """One measurement (GPU, compute capability, CPU, shapes, median) under the device classes it stands for:
    "gpu:<model>" and "cc:<x.y>" for a GPU measurement, "cpu:<model>" for a CPU one, with the input shapes it was
    taken at; the best where two measurements share a class."""
    gpu, cc, cpu, at, ms = measured
    classes = [f"gpu:{gpu}", f"cc:{cc}" if cc else None] if gpu else [f"cpu:{cpu or 'unknown'}"]
    for c in filter(None, classes):
        if c not in latencies or ms < latencies[c]:
            latencies[c] = ms
            shapes[c] = canonical_shapes(at)


@functools.lru_cache(maxsize=4096)
def canonical_shapes(text: str | None) -> str:
    """``shapes_key`` of a measurement's shapes as the database wrote them (each distinct text parsed once)."""
    return shapes_key(json_loads(text) if text else None)


VERSION_OF = select(ModelRow.version).where(ModelRow.id == bindparam("id"))


@dataclass(frozen=True)
class Verdict:
    """The asking project's accuracy verdict on an engine, as an answer's engine shows it."""

    accuracy: dict | None
    accuracy_pass: bool | None


def chosen_engine(
    session: Session, table: EngineTable, engine_id: int, owner: dict[str, Row], models: list[Row]
) -> tuple[Parsed, Row, str | None, Verdict | None]:
    """The chosen engine's row (read with the table: ANSWER_COLUMNS), the version it is listed under, the version
    that version is a variant of (an int8 model derived from it), if any, and the owning project's verdict on it:
    for the answer's engine; kept in the table (the same state). No statement, but for a derived model whose
    source is not among ``models`` (the versions the request read)."""
    if (kept := table.chosen.get(engine_id)) is not None:
        return kept
    row = Parsed(table.rows[engine_id], next(f.descriptor for f in table.facts if f.id == engine_id))
    model = owner[row.model_sha256]
    source = model.source_model_id
    variant_of = None
    if source is not None:
        variant_of = next((m.version for m in models if m.id == source), None)
        if variant_of is None:
            variant_of = session.connection().execute(VERSION_OF, {"id": source}).scalar()
    verdict = Verdict(json_loads(row.verdict_accuracy), row.accuracy_pass) if row.verdict_id is not None else None
    kept = table.chosen[engine_id] = (row, model, variant_of, verdict)
    return kept


class Parsed:
    """An ENGINES_OF row read by name, its JSON facts parsed (its descriptor's), as an answer's engine is built."""

    __slots__ = ("_row", "_descriptor")

    def __init__(self, row: Row, descriptor: EngineDescriptor):
        self._row, self._descriptor = row, descriptor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._descriptor if name in JSON_FACTS else self._row, name)


def project_of(owner: dict[str, Row]) -> str:
    """The one project whose models a resolve reads (``find_models`` never mixes projects)."""
    return next(iter(owner.values())).project if owner else ""


class Facts(NamedTuple):
    """One engine as judging and ranking need it, compiled once per table: its id and spec hash, its plain row
    (ENGINES_OF's), its descriptor, the asking project's accuracy verdict ("pass", "fail" or None), its latencies
    by device class, the seq of the version it is listed under, and the input shapes of each latency."""

    id: int
    spec_hash: str
    row: Row
    descriptor: EngineDescriptor
    accuracy: str | None
    latencies: dict[str, float]
    model_seq: int
    shapes: dict[str, str]  # the input shapes of each latency, by device class (``canonical_shapes``)
    machines: dict[str, int]  # for a fleet class: how many machines its latency is the median of


@dataclass(frozen=True)
class EngineTable:
    """Every engine of a set of model versions' bytes, compiled for judging. A function of the versions' ids and
    generations and the project (the generation moves with any change to the engines, their benchmarks or the
    project's verdicts), so it may be kept under ``key`` and shared by every machine that asks."""

    key: tuple
    facts: tuple[Facts, ...]
    rows: dict[int, Row] = field(default_factory=dict)  # their JSON facts as text: parsed in ``facts``
    # ``chosen_engine``'s answers for engines of this table (the same state), kept with it.
    chosen: dict[int, tuple] = field(default_factory=dict)


def table_key(owner: dict[str, Row]) -> tuple:
    return (project_of(owner), *sorted((m.id, m.generation) for m in owner.values()))


def engine_table(session: Session, owner: dict[str, Row], ids: tuple[int, ...] | None = None) -> EngineTable:
    """Read and compile the engines of these models' bytes (or only the engines ``ids`` of them) with the evidence
    of the models' project: one statement (ENGINES_OF, ENGINES_BY_ID), on the session's connection (Core, no
    ORM)."""
    key = table_key(owner)
    params: dict[str, Any] = {"project": project_of(owner)}
    if ids is None:
        statement, params["shas"] = ENGINES_OF, list(owner)
    else:
        statement, params["ids"], key = ENGINES_BY_ID, list(ids), (key, ids)
    rows: dict[int, Row] = {}  # an engine's first row: the others differ only in their measurement
    latency: dict[int, dict[str, float]] = {}
    shapes: dict[int, dict[str, str]] = {}
    for r in driver_rows(session.connection(), statement, params):
        if (mine := latency.get(r[0])) is None:
            rows[r[0]], mine = r, latency.setdefault(r[0], {})
            shapes[r[0]] = {}
        measured = r[_MEASURED]
        if measured[-1] is not None:
            _add_latency(mine, shapes[r[0]], measured)
    seq = {sha: m.seq for sha, m in owner.items()}
    parsed: dict[str | None, Any] = {None: None}  # each distinct JSON text once (a model's engines share a few)

    def descriptor(r: Row) -> EngineDescriptor:
        values = list(r[_FACTS])
        for at in _JSON_AT:
            text = values[at]
            if (value := parsed.get(text, parsed)) is parsed:
                value = parsed[text] = json_loads(text)
            values[at] = value
        return EngineDescriptor.from_values(values)

    machines: dict[int, dict[str, int]] = {}
    for engine_id, figures in fleet.figures_of(session, list(rows), params["project"]).items():
        for c, f in class_figures(figures).items():  # the fleet's classes: beside the farm's, never mixed
            latency[engine_id][c], shapes[engine_id][c] = f.median_ms, f.shapes
            machines.setdefault(engine_id, {})[c] = f.machines
    facts = tuple(
        Facts(
            r[0],
            r[2],
            r,
            descriptor(r),
            _ACCURACY[r[_PASSED]],
            latency[r[0]],
            seq[r[1]],
            shapes[r[0]],
            machines.get(r[0], {}),
        )
        for r in rows.values()
    )
    return EngineTable(key, facts, rows)


@dataclass(frozen=True)
class KindTable:
    """The kinds of engine of a set of model versions' bytes, each by its kind key, with its engines' ids and its
    facts as an EngineDescriptor (``describe``; its own facts empty). A function of what an EngineTable is
    (``key``: ``("kinds", table_key)``)."""

    key: tuple
    kinds: tuple[int, ...]
    ids: tuple[tuple[int, ...], ...]
    facts: dict[int, EngineDescriptor]

    def describe(self, kind: int) -> EngineDescriptor:
        return self.facts[kind]


# Every kind's facts seen by this process, by kind key: a few hundred in a farm of a million engines.
_KINDS: dict[int, EngineDescriptor] = {}
_KINDS_KEPT = 65536


def kind_table(session: Session, owner: dict[str, Row]) -> KindTable:
    """The kinds of these models' engines (KINDS_OF): one statement, a row per kind; and the facts of a kind this
    process has not seen before (KIND_FACTS_OF), one statement more."""
    connection = session.connection()
    shas = list(owner)
    rows = driver_rows(connection, KINDS_OF[connection.dialect.name], {"shas": shas})
    kinds, ids = zip(*rows) if rows else ((), ())
    if connection.dialect.name != "postgresql":
        ids = tuple(map(int, text.split(",")) for text in ids)
    facts = {k: d for k in kinds if (d := _KINDS.get(k)) is not None}
    if missing := [k for k in kinds if k not in facts]:
        if len(_KINDS) >= _KINDS_KEPT:
            _KINDS.clear()
        for r in driver_rows(connection, KIND_FACTS_OF, {"shas": shas, "keys": missing}):
            facts[r[0]] = _KINDS[r[0]] = kind_of(r[1:])
        # a kind whose engines went in between the two reads (no transaction holds them together) is gone
        kinds, ids = tuple(zip(*[(k, i) for k, i in zip(kinds, ids) if k in facts])) or ((), ())
    return KindTable(("kinds", table_key(owner)), kinds, tuple(map(tuple, ids)), facts)


_CC_AT = KIND_FACTS.index("compute_capabilities")


def kind_of(kind: tuple) -> EngineDescriptor:
    """An EngineDescriptor of a kind's facts (a row of KIND_COLUMNS: its JSON facts parsed; its own facts empty)."""
    facts = dict(zip(KIND_FACTS, kind))
    facts["compute_capabilities"] = (json_loads(kind[_CC_AT]) if kind[_CC_AT] else None) or []
    facts["version_compatible"] = bool(facts["version_compatible"])
    return EngineDescriptor(**facts)
