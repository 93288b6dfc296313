"""Resolution's reads: the versions a request names, the facts of their engines, and the chosen engine's row.

This is /v1/resolve's hot path, so it reads plain rows of only the columns resolution uses: no ORM objects, no
JSON it never reads (an engine's accuracy metrics, a model's graph facts), and one aggregate for the latency
evidence instead of every benchmark row, on the session's connection (Core statements built once). The engines
come back compiled (``EngineTable``: descriptors and evidence, ready to judge), keyed by what they are a function
of, so the API may keep them. Judging and answering are ``enginefarm.api.resolver``'s; this module only reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Row, and_, bindparam, func, select
from sqlalchemy.orm import Session

from enginefarm.core.domain import ENGINE_FACTS, EngineDescriptor
from enginefarm.core.spec import DEFAULT_SHAPE_KEY
from enginefarm.storage.catalog import find_models, latest_of
from enginefarm.storage.tables import BenchmarkRow, EngineRow, ModelRow, VerdictRow

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
# What judging, ranking and a candidate's line need of an engine: its facts, and the project's verdict.
ENGINE_COLUMNS = (
    EngineRow.id,
    EngineRow.model_sha256,
    EngineRow.spec_hash,
    *(getattr(EngineRow, name) for name in ENGINE_FACTS),
    VerdictRow.accuracy_pass,
)


def model_versions(session: Session, model: str, version: str | None, project: str | None) -> list[Row]:
    """The model rows a request names (plain rows of MODEL_COLUMNS): one version, the newest with "latest", or
    every version. Raises NotFound or Conflict as ``find_models`` does."""
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


# Built once: a statement's construction costs more than its compiled form's cache lookup. The verdict joined is
# the asking project's own: another project's check of the same bytes never decides what this one is handed.
ENGINES_OF = (
    select(*ENGINE_COLUMNS)
    .outerjoin(VerdictRow, and_(VerdictRow.engine_id == EngineRow.id, VerdictRow.project == bindparam("project")))
    .where(EngineRow.model_sha256.in_(bindparam("shas", expanding=True)))
)
LATENCY_OF = (
    select(
        BenchmarkRow.engine_id,
        BenchmarkRow.gpu_name,
        BenchmarkRow.compute_capability,
        BenchmarkRow.cpu_name,
        func.min(BenchmarkRow.median_ms),
    )
    .join(EngineRow, EngineRow.id == BenchmarkRow.engine_id)
    .where(
        EngineRow.model_sha256.in_(bindparam("shas", expanding=True)),
        BenchmarkRow.shape_key == DEFAULT_SHAPE_KEY,
        BenchmarkRow.project == bindparam("project"),
    )
    .group_by(BenchmarkRow.engine_id, BenchmarkRow.gpu_name, BenchmarkRow.compute_capability, BenchmarkRow.cpu_name)
)


def _latencies(conn, model_shas: list[str], project: str) -> dict[int, dict[str, float]]:
    """The project's best median latency at the default shape of each engine of these bytes, by the device class
    it was measured on: "gpu:<model>" and "cc:<x.y>" for a GPU measurement, "cpu:<model>" for a CPU one."""
    out: dict[int, dict[str, float]] = {}
    for engine_id, gpu, cc, cpu, ms in conn.execute(LATENCY_OF, {"shas": model_shas, "project": project}):
        classes = [f"gpu:{gpu}", f"cc:{cc}" if cc else None] if gpu else [f"cpu:{cpu or 'unknown'}"]
        mine = out.setdefault(engine_id, {})
        for c in filter(None, classes):
            mine[c] = min(ms, mine.get(c, ms))
    return out


VERSION_OF = select(ModelRow.version).where(ModelRow.id == bindparam("id"))
# The chosen engine's whole row and the asking project's verdict on it, in one statement.
CHOSEN = (
    select(
        EngineRow.__table__,
        VerdictRow.id.label("verdict_id"),
        VerdictRow.accuracy.label("verdict_accuracy"),
        VerdictRow.accuracy_pass.label("verdict_pass"),
    )
    .outerjoin(VerdictRow, and_(VerdictRow.engine_id == EngineRow.id, VerdictRow.project == bindparam("project")))
    .where(EngineRow.id == bindparam("id"))
)


@dataclass(frozen=True)
class Verdict:
    """The asking project's accuracy verdict on an engine, as an answer's engine shows it."""

    accuracy: dict | None
    accuracy_pass: bool | None


def chosen_engine(
    session: Session, engine_id: int, owner: dict[str, Row]
) -> tuple[Row, Row, str | None, Verdict | None]:
    """The chosen engine's whole row, the version it is listed under, the version that version is a variant of
    (an int8 model derived from it), if any, and the owning project's verdict on it: for the answer's engine.
    Two statements at most (the variant's only for a derived model)."""
    conn = session.connection()
    row = conn.execute(CHOSEN, {"id": engine_id, "project": project_of(owner)}).one()
    model = owner[row.model_sha256]
    source = model.source_model_id
    variant_of = conn.execute(VERSION_OF, {"id": source}).scalar() if source is not None else None
    verdict = Verdict(row.verdict_accuracy, row.verdict_pass) if row.verdict_id is not None else None
    return row, model, variant_of, verdict


def project_of(owner: dict[str, Row]) -> str:
    """The one project whose models a resolve reads (``find_models`` never mixes projects)."""
    return next(iter(owner.values())).project if owner else ""


@dataclass(frozen=True)
class Facts:
    """One engine as judging and ranking need it, compiled once per table: its plain row (ENGINE_COLUMNS), its
    descriptor, the asking project's accuracy verdict ("pass", "fail" or None), its latencies by device class, and
    the seq of the version it is listed under."""

    row: Row
    descriptor: EngineDescriptor
    accuracy: str | None
    latencies: dict[str, float]
    model_seq: int


@dataclass(frozen=True)
class EngineTable:
    """Every engine of a set of model versions' bytes, compiled for judging. A function of the versions' ids and
    generations and the project (the generation moves with any change to the engines, their benchmarks or the
    project's verdicts), so it may be kept under ``key`` and shared by every machine that asks."""

    key: tuple
    facts: tuple[Facts, ...]
    rows: dict[int, Row] = field(default_factory=dict)
    # ``chosen_engine``'s answers for engines of this table, kept by whoever keeps the table (the same state).
    chosen: dict[int, tuple] = field(default_factory=dict)


def _accuracy(passed: bool | None) -> str | None:
    return None if passed is None else ("pass" if passed else "fail")


def table_key(owner: dict[str, Row]) -> tuple:
    return (project_of(owner), *sorted((m.id, m.generation) for m in owner.values()))


def engine_table(session: Session, owner: dict[str, Row]) -> EngineTable:
    """Read and compile the engines of these models' bytes with the evidence of the models' project: two queries,
    on the session's connection (Core, no ORM)."""
    project = project_of(owner)
    conn = session.connection()
    rows = conn.execute(ENGINES_OF, {"shas": list(owner), "project": project}).all()
    latency = _latencies(conn, list(owner), project) if rows else {}
    facts = tuple(
        Facts(
            r,
            EngineDescriptor.from_values(r[_FACTS]),
            _accuracy(r.accuracy_pass),
            latency.get(r.id, {}),
            owner[r.model_sha256].seq,
        )
        for r in rows
    )
    return EngineTable(table_key(owner), facts, {r.id: r for r in rows})
