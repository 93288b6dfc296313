"""SQLAlchemy tables of the catalog. The domain types live in enginefarm.core.domain."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    event,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from enginefarm.core.compat import KIND_FACTS, kind_key
from enginefarm.core.domain import Target
from enginefarm.core.spec import DEFAULT_SHAPE_KEY, BuildSpec


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class ModelRow(Base):
    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("project", "name", "version", name="uq_models_project_name_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The tenant that owns the model; '' where the farm has no projects. Names and versions are per project.
    project: Mapped[str] = mapped_column(String(64), index=True, default="", server_default="")
    name: Mapped[str] = mapped_column(String(200), index=True)
    version: Mapped[str] = mapped_column(String(100))
    seq: Mapped[int] = mapped_column(Integer)  # order of versions under one name: newer is larger
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    format: Mapped[str] = mapped_column(String(8))  # onnx, zip or tar
    blob_key: Mapped[str] = mapped_column(String(200))
    size: Mapped[int] = mapped_column(BigInteger)  # bytes as uploaded
    info: Mapped[dict] = mapped_column(JSON)  # enginefarm.core.domain.ModelInfo
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # A model the farm made from another (an int8 Q/DQ model from its FP32 source), and how.
    source_model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id"), index=True)
    derivation: Mapped[dict | None] = mapped_column(JSON)
    # Sample inputs (.npz) for calibration and the accuracy check, stored content-addressed.
    samples_sha256: Mapped[str | None] = mapped_column(String(64))
    samples_key: Mapped[str | None] = mapped_column(String(200))
    samples_info: Mapped[dict | None] = mapped_column(JSON)  # input name -> shape and dtype, sample count
    # Raised whenever an engine of these bytes, or one of its benchmarks, changes (storage.generation):
    # resolve answers are cached and tagged by it.
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    source: Mapped[ModelRow | None] = relationship(remote_side=[id])  # noqa: A003 - the column above


class BuildRow(Base):
    __tablename__ = "builds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    spec: Mapped[dict] = mapped_column(JSON)
    spec_hash: Mapped[str] = mapped_column(String(64), index=True)
    targets: Mapped[list] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id"), index=True)
    variant: Mapped[str | None] = mapped_column(String(200))  # a sweep's label for this build, "fp16 opt3"
    # The int8 quantization stage, when the build needed a Q/DQ model first: state, source, report, error.
    quantize: Mapped[dict | None] = mapped_column(JSON)
    # The API token that asked for the build, which its queue limit counts against; unset for a build the farm
    # made without one, and once the token is deleted.
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"), index=True)

    model: Mapped[ModelRow] = relationship()
    tasks: Mapped[list[BuildTaskRow]] = relationship(back_populates="build", order_by="BuildTaskRow.id")

    @property
    def build_spec(self) -> BuildSpec:
        """The stored spec (``BuildSpec.stored()``) as the type every layer works with."""
        return BuildSpec.model_validate(self.spec)


class BuildTaskRow(Base):
    __tablename__ = "build_tasks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    target: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    worker_id: Mapped[str | None] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    reused: Mapped[bool] = mapped_column(Boolean, default=False)
    engine_id: Mapped[int | None] = mapped_column(ForeignKey("engines.id"))
    error: Mapped[str | None] = mapped_column(Text)
    log_tail: Mapped[str | None] = mapped_column(Text)
    queued_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    build: Mapped[BuildRow] = relationship(back_populates="tasks")

    @property
    def parsed_target(self) -> Target:
        """The stored target as the type every layer works with."""
        return Target.parse(self.target)


class EngineRow(Base):
    """A built engine: where its bytes are, what it was built from and by whom, and its facts, one column for each
    of ``EngineDescriptor``'s fields under the same name (tests/unit/test_engine_facts.py holds them to it)."""

    __tablename__ = "engines"
    __table_args__ = (
        # Identical work never runs twice: this is the content address of a build.
        UniqueConstraint("model_sha256", "spec_hash", "target", "backend_version", name="uq_engines_build_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    model_sha256: Mapped[str] = mapped_column(String(64))
    spec_hash: Mapped[str] = mapped_column(String(64), index=True)
    target: Mapped[str] = mapped_column(String(64), index=True)
    backend: Mapped[str] = mapped_column(String(32), index=True)
    backend_version: Mapped[str] = mapped_column(String(64))
    precision: Mapped[str] = mapped_column(String(8), index=True)
    compute_capability: Mapped[str | None] = mapped_column(String(8), index=True)
    compute_capabilities: Mapped[list] = mapped_column(JSON, default=list)
    gpu_name: Mapped[str | None] = mapped_column(String(200))
    platform: Mapped[str] = mapped_column(String(16))
    trt_version: Mapped[str | None] = mapped_column(String(64), index=True)
    cuda_version: Mapped[str | None] = mapped_column(String(32))
    driver_version: Mapped[str | None] = mapped_column(String(32))
    hardware_compat: Mapped[str] = mapped_column(String(32), default="none")
    version_compatible: Mapped[bool] = mapped_column(Boolean, default=False)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(200))
    build_seconds: Mapped[float] = mapped_column(Float)
    built_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # ``compat.kind_key`` of its kind facts, written with the row (``_keyed``): a model's engines are grouped into
    # kinds by this one column (``storage.resolution.kind_table``).
    kind_key: Mapped[int] = mapped_column(BigInteger)
    # GPU activation memory the engine asks for when it is loaded, once a GPU worker has seen it.
    device_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # An engine's accuracy verdicts and benchmarks belong to the project that asked for them (VerdictRow,
    # BenchmarkRow.project): the engine row holds only what its bytes are, which projects share.
    # The optimization profiles it was built with, per input min/opt/max (enginefarm.core.domain.engine_profiles);
    # empty when not known. Resolution judges a machine's shapes against them.
    profiles: Mapped[list] = mapped_column(JSON, default=list, server_default="[]")
    # An onnxruntime/cuda artifact's CUDA provider options measured fastest on its GPU (EngineDescriptor.run_options).
    run_options: Mapped[dict] = mapped_column(JSON, default=dict, server_default="{}")

    model: Mapped[ModelRow] = relationship()
    benchmarks: Mapped[list[BenchmarkRow]] = relationship(back_populates="engine", order_by="BenchmarkRow.id")


@event.listens_for(EngineRow, "before_insert")
@event.listens_for(EngineRow, "before_update")
def _keyed(_mapper, _connection, row: EngineRow) -> None:
    row.kind_key = kind_key({name: getattr(row, name) for name in KIND_FACTS})


class BenchmarkRow(Base):
    """One benchmark of one engine at one shape, on one machine, for one project: the summary of the raw samples."""

    __tablename__ = "benchmarks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    engine_id: Mapped[int] = mapped_column(ForeignKey("engines.id"), index=True)
    # The project whose check measured it: its settings chose the shapes, so only its own reads see it.
    project: Mapped[str] = mapped_column(String(64), default="", server_default="")
    shape_key: Mapped[str] = mapped_column(String(200), default=DEFAULT_SHAPE_KEY)
    shapes: Mapped[dict] = mapped_column(JSON, default=dict)  # input name -> dims measured at
    gpu_name: Mapped[str | None] = mapped_column(String(200), index=True)  # None for CPU benchmarks
    cpu_name: Mapped[str | None] = mapped_column(String(200))  # the CPU model a CPU benchmark ran on
    compute_capability: Mapped[str | None] = mapped_column(String(8))
    machine: Mapped[dict] = mapped_column(JSON, default=dict)  # the fingerprint it was measured on
    median_ms: Mapped[float] = mapped_column(Float)  # end-to-end latency, the figure ranking uses
    p99_ms: Mapped[float | None] = mapped_column(Float)
    throughput_qps: Mapped[float | None] = mapped_column(Float)
    stats: Mapped[dict] = mapped_column(JSON, default=dict)  # every statistic the benchmark reports
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    engine: Mapped[EngineRow] = relationship(back_populates="benchmarks")


class DeviceMeasurementRow(Base):
    """A figure a deploy machine measured of one engine on its own GPU (or CPU) and posted back: the fleet's
    benchmark, beside the farm's own (BenchmarkRow). It is the project's whose token posted it: another project's
    devices never change a ranking or a gate. ``machine_id`` is the machine's stable anonymous id (the client's),
    so a machine counts once in its class however often it posts."""

    __tablename__ = "device_measurements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    engine_id: Mapped[int] = mapped_column(ForeignKey("engines.id"), index=True)
    project: Mapped[str] = mapped_column(String(64), default="", server_default="")
    source: Mapped[str] = mapped_column(String(16), default="fleet")
    machine_id: Mapped[str] = mapped_column(String(64))
    gpu_name: Mapped[str | None] = mapped_column(String(200))
    compute_capability: Mapped[str | None] = mapped_column(String(8))
    cpu_name: Mapped[str | None] = mapped_column(String(200))
    machine: Mapped[dict] = mapped_column(JSON, default=dict)  # the full fingerprint it was measured on
    runtime: Mapped[str] = mapped_column(String(64))  # what ran it: "onnxruntime/CPUExecutionProvider", ...
    runtime_version: Mapped[str] = mapped_column(String(64))
    shapes: Mapped[dict] = mapped_column(JSON, default=dict)  # input name -> dims measured at
    median_ms: Mapped[float] = mapped_column(Float)
    p99_ms: Mapped[float | None] = mapped_column(Float)
    throughput_qps: Mapped[float | None] = mapped_column(Float)
    stats: Mapped[dict] = mapped_column(JSON, default=dict)
    # The device's accuracy check against the farm's fp32 reference outputs; None where it did not check.
    accuracy: Mapped[dict | None] = mapped_column(JSON)
    accuracy_pass: Mapped[bool | None] = mapped_column(Boolean)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"), index=True)  # its poster (quotas)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)

    engine: Mapped[EngineRow] = relationship()


class ReferenceRow(Base):
    """The inputs of an accuracy check and ONNX Runtime FP32's outputs on them, one ``.npz`` blob per distinct set
    (``enginefarm.measure.check.Reference``). A worker computes it once per reference model and inputs
    (``identity``); the farm's checks and deploy machines' (``GET /v1/engines/{id}/reference``) judge against it."""

    __tablename__ = "accuracy_references"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    identity: Mapped[str] = mapped_column(String(64), unique=True)  # the reference model's sha and the inputs'
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)  # the model run in fp32
    blob_key: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    origin: Mapped[str] = mapped_column(Text)  # where the inputs came from, in words
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class BenchmarkTaskRow(Base):
    """The benchmark and accuracy check of one engine with one set of check settings, on a capable worker."""

    __tablename__ = "benchmark_tasks"
    __table_args__ = (
        UniqueConstraint("engine_id", "checks_hash", "project", name="uq_benchmark_tasks_engine_checks_project"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    engine_id: Mapped[int] = mapped_column(ForeignKey("engines.id"), index=True)
    # The project whose build asked for the check: its samples and settings, its verdict.
    project: Mapped[str] = mapped_column(String(64), default="", server_default="")
    target: Mapped[str] = mapped_column(String(64), index=True)
    checks_hash: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)  # the build spec it was asked with (BuildSpec.stored())
    state: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    worker_id: Mapped[str | None] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    queued_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The reference outputs this check's settings judge against (None until a worker computed them).
    reference_id: Mapped[int | None] = mapped_column(ForeignKey("accuracy_references.id", ondelete="SET NULL"))

    engine: Mapped[EngineRow] = relationship()
    reference: Mapped[ReferenceRow | None] = relationship()

    @property
    def build_spec(self) -> BuildSpec:
        """The stored spec (``BuildSpec.stored()``) as the type every layer works with."""
        return BuildSpec.model_validate(self.spec)

    @property
    def parsed_target(self) -> Target:
        """The stored target as the type every layer works with."""
        return Target.parse(self.target)


class VerdictRow(Base):
    """A project's accuracy verdict on one engine: the last finished check of that project's settings and samples.

    Engines are shared between projects through identical bytes; verdicts are not. One project's check settings
    can never change what another project's resolve, gate or report reads."""

    __tablename__ = "engine_verdicts"
    __table_args__ = (UniqueConstraint("engine_id", "project", name="uq_engine_verdicts_engine_project"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    engine_id: Mapped[int] = mapped_column(ForeignKey("engines.id"), index=True)
    project: Mapped[str] = mapped_column(String(64), default="", server_default="")
    # The accuracy gate against ONNX Runtime FP32: per-output metrics, and whether it passed.
    accuracy: Mapped[dict] = mapped_column(JSON)
    accuracy_pass: Mapped[bool | None] = mapped_column(Boolean)
    benchmark_task_id: Mapped[int | None] = mapped_column(ForeignKey("benchmark_tasks.id", ondelete="SET NULL"))
    checked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    engine: Mapped[EngineRow] = relationship()


class SweepRow(Base):
    """A grid of build variants of one model; each variant is a build with ``sweep_id`` set."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    axes: Mapped[dict] = mapped_column(JSON)  # spec field -> the values tried
    targets: Mapped[list] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    builds: Mapped[list[BuildRow]] = relationship(order_by="BuildRow.id")


class WorkerRow(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    targets: Mapped[list] = mapped_column(JSON)
    bench_targets: Mapped[list] = mapped_column(JSON, default=list)  # engines its GPU (or CPU) can run
    probe: Mapped[dict] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class ApiTokenRow(Base):
    """An API token. Only its sha256 is stored: the token itself is shown once, when it is made."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # the token's first characters, to tell tokens apart
    scopes: Mapped[list] = mapped_column(JSON)  # of enginefarm.core.domain.SCOPES
    project: Mapped[str | None] = mapped_column(String(64))  # None: the whole farm; else only that project
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A dashboard session: the token whose sign-in opened it. Revoking that token revokes its sessions.
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"), index=True)
