"""Domain types shared by the API, the worker and the catalog.

Targets, tensor and model descriptions, task states, engine descriptors and the compatibility levels they are
judged by. Build specs are in ``enginefarm.core.spec``, shapes as users write them in ``enginefarm.core.shapes``. Plain
typed objects: SQLAlchemy tables (storage/tables.py) and public API schemas (api/schemas/__init__.py) wrap them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, Literal

# --------------------------------------------------------------------------- backends and targets


class StrEnum(str, Enum):
    """An enum whose members are their string values (``enum.StrEnum`` is Python 3.11+; the client runs on 3.10)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Backend(StrEnum):
    TENSORRT = "tensorrt"
    TENSORRT_RTX = "tensorrt-rtx"
    ONNXRUNTIME = "onnxruntime"


# The int8 recipe family a backend's engines are quantized by: ONNX Runtime's own, or TensorRT's Q/DQ (TensorRT and
# TensorRT-RTX alike).
QuantizeFamily = Literal["onnxruntime", "tensorrt"]
QUANTIZE_FAMILIES: tuple[QuantizeFamily, ...] = ("onnxruntime", "tensorrt")


def quantize_family(backend: str) -> QuantizeFamily:
    """The int8 recipe family of a backend's engines (``backend``: a ``Backend`` value)."""
    return "onnxruntime" if backend == Backend.ONNXRUNTIME else "tensorrt"


# The Python module each backend imports; the worker probe and the backends share this.
BACKEND_MODULES: dict[Backend, str] = {
    Backend.TENSORRT: "tensorrt",
    Backend.TENSORRT_RTX: "tensorrt_rtx",
    Backend.ONNXRUNTIME: "onnxruntime",
}

# An ONNX Runtime target for its CUDA execution provider is written onnxruntime/cuda-smXY.
ORT_CUDA_PREFIX = "cuda-"

# Architectures each backend can build for. Full TensorRT builds only for the GPU it runs on;
# TensorRT-RTX compiles ahead of time for any of its compute capabilities, or "portable".
ARCHES: dict[Backend, tuple[str, ...]] = {
    Backend.TENSORRT: ("sm75", "sm80", "sm86", "sm87", "sm89", "sm90", "sm100", "sm120"),
    Backend.TENSORRT_RTX: ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121", "portable"),
    # ONNX Runtime's CPU artifact per CPU architecture, and its CUDA execution provider per compute capability
    # (onnxruntime-gpu ships x86_64 wheels for CUDA 12 and 13; CUDA 13 builds start at sm75).
    Backend.ONNXRUNTIME: (
        "cpu-x86_64",
        "cpu-aarch64",
        *(f"{ORT_CUDA_PREFIX}{a}" for a in ("sm75", "sm80", "sm86", "sm89", "sm90", "sm100", "sm120")),
    ),
}

# Compute capabilities a portable TensorRT-RTX engine runs on (the 1.7.1 runtime's own list).
RTX_PORTABLE_CCS: tuple[str, ...] = ("8.0", "8.6", "8.9", "12.0", "12.1")

JETSON_CCS = frozenset({"7.2", "8.7", "10.1", "11.0"})


def cc_of_arch(arch: str) -> str | None:
    """``sm86`` → ``8.6``, ``sm120`` → ``12.0``, ``cuda-sm90`` → ``9.0``; None for CPU and portable architectures."""
    arch = arch.removeprefix(ORT_CUDA_PREFIX)
    if not arch.startswith("sm") or not arch[2:].isdigit():
        return None
    digits = arch[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def arch_of_cc(cc: str) -> str:
    """``8.6`` → ``sm86``."""
    major, _, minor = cc.partition(".")
    return f"sm{int(major)}{int(minor or 0)}"


def cc_tuple(cc: str) -> tuple[int, int]:
    major, _, minor = cc.partition(".")
    return int(major), int(minor or 0)


@dataclass(frozen=True, order=True)
class Target:
    """A backend plus an architecture, written ``tensorrt-rtx/sm86`` or ``onnxruntime/cpu-x86_64``."""

    backend: Backend
    arch: str

    @classmethod
    def parse(cls, text: str) -> Target:
        backend_name, sep, arch = text.strip().partition("/")
        if not sep or not arch:
            raise ValueError(f"target {text!r} must be written BACKEND/ARCH, for example tensorrt-rtx/sm86")
        try:
            backend = Backend(backend_name)
        except ValueError:
            known = ", ".join(b.value for b in Backend)
            raise ValueError(f"target {text!r}: unknown backend {backend_name!r} (known: {known})") from None
        if arch not in ARCHES[backend]:
            raise ValueError(
                f"target {text!r}: {backend.value} cannot build for {arch!r} "
                f"(it builds for: {', '.join(ARCHES[backend])})"
            )
        return cls(backend, arch)

    def __str__(self) -> str:
        return f"{self.backend.value}/{self.arch}"

    @property
    def compute_capability(self) -> str | None:
        return cc_of_arch(self.arch)

    @property
    def queue(self) -> str:
        """The Celery queue for this target's build tasks: only workers that can build it consume it."""
        return f"build.{self.backend.value}.{self.arch}"

    @property
    def bench_queue(self) -> str:
        """The queue for benchmarking this target's engines: only workers that can run them consume it."""
        return f"bench.{self.backend.value}.{self.arch}"

    @property
    def is_gpu(self) -> bool:
        return self.backend is not Backend.ONNXRUNTIME or self.is_ort_cuda

    @property
    def is_ort_cuda(self) -> bool:
        """An ONNX Runtime target for its CUDA execution provider (``onnxruntime/cuda-sm90``)."""
        return self.backend is Backend.ONNXRUNTIME and self.arch.startswith(ORT_CUDA_PREFIX)


# Int8 quantization from samples runs on a CPU worker with ONNX Runtime.
QUANTIZE_QUEUE = "quantize.onnxruntime"


def gpu_stage_queue(target: Target) -> str:
    """The queue of a waiting stage that must run where ``target`` (an ``onnxruntime/cuda-smXY``) runs: an fp16
    repair judged on that GPU. Workers serving the target consume it beside QUANTIZE_QUEUE."""
    return f"{QUANTIZE_QUEUE}.{target.arch}"


def build_queues(targets: list[Target]) -> list[str]:
    """The queues a worker building ``targets`` consumes: each target's build queue; the quantize queue where it
    has an ONNX Runtime target (ONNX Runtime workers run the int8 and fp16 repair stages); and the stage queue of
    each ``onnxruntime/cuda`` target (an fp16 repair judged on that GPU)."""
    queues = [t.queue for t in targets]
    if any(t.backend is Backend.ONNXRUNTIME for t in targets):
        queues.append(QUANTIZE_QUEUE)
    return queues + [gpu_stage_queue(t) for t in targets if t.is_ort_cuda]


# ``BuildRow.quantize["kind"]`` of an fp16 build's accuracy repair stage, which runs on the quantize queue before the
# build's tasks as int8's quantization does (an int8 stage has no kind).
FP16_REPAIR_STAGE = "fp16-repair"


def all_targets() -> list[Target]:
    return [Target(b, a) for b in Backend for a in ARCHES[b]]


# --------------------------------------------------------------------------- models


@dataclass
class TensorInfo:
    """A graph input or output: name, ONNX element type name, dims (int, symbolic name, or None)."""

    name: str
    dtype: str
    dims: list[int | str | None]

    @property
    def dynamic_axes(self) -> list[int]:
        return [i for i, d in enumerate(self.dims) if not isinstance(d, int) or d <= 0]


@dataclass
class ModelInfo:
    """What an upload's inspection learned about the model."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    opset: int
    ir_version: int
    producer: str
    size: int  # bytes of the graph plus its external data
    has_qdq: bool = False
    external_data: bool = False
    op_types: dict[str, int] = field(default_factory=dict)  # op type -> node count, subgraphs included
    # Integer inputs that index a table (a Gather's indices): the valid [low, high] from the table's size.
    index_ranges: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelInfo:
        data = dict(data)
        data["inputs"] = [TensorInfo(**t) for t in data["inputs"]]
        data["outputs"] = [TensorInfo(**t) for t in data["outputs"]]
        return cls(**data)


# --------------------------------------------------------------------------- facts about inputs


# Dim names that exporters write for "unknown": each occurrence is its own dim, not a shared one.
ANONYMOUS_DIMS = frozenset({"", "?", "-1", "unk", "None"})


# --------------------------------------------------------------------------- engines and machines


class HardwareCompat(StrEnum):
    """How widely an engine runs beyond the GPU that built it (TensorRT's hardware-compatibility levels)."""

    NONE = "none"
    AMPERE_PLUS = "ampere_plus"
    SAME_COMPUTE_CAPABILITY = "same_compute_capability"


class TaskState(StrEnum):
    WAITING = "waiting"  # for an earlier stage (the int8 quantization) before it can be queued
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATES = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED})

# An API token's scopes, each including the ones before it: reads, then posting what a deploy machine measured of
# an engine (enginefarm measure), then uploads and builds, then managing tokens.
SCOPES = ("read", "measure", "build", "admin")


def scope_allows(scope: str, needed: str) -> bool:
    """Whether a token of ``scope`` may do what needs ``needed``."""
    return SCOPES.index(scope) >= SCOPES.index(needed)


@dataclass
class EngineDescriptor:
    """Everything needed to decide whether an engine runs on a machine, as built by a worker.

    The one list of an engine's facts: the catalog's engine row stores each as a column of the same name, resolution
    reads those columns (``storage.resolution.ENGINE_COLUMNS``), and the API's engine answer (``EngineOut``) and the
    client's cached records carry them under the same names. Add a fact here, as a column (with its migration) and
    nowhere else. ``metadata["doc"]`` is what the API's schema says of a fact."""

    target: str
    backend: str
    backend_version: str
    precision: str
    platform: str
    compute_capability: str | None = None
    compute_capabilities: list[str] = field(default_factory=list)  # portable TensorRT-RTX engines
    gpu_name: str | None = None
    trt_version: str | None = None
    cuda_version: str | None = None
    driver_version: str | None = None
    hardware_compat: str = HardwareCompat.NONE.value
    version_compatible: bool = False
    size: int = 0
    sha256: str = ""
    # Facts that may be unknown (``optional``): an answer may leave them out, and their default says so.
    device_memory_bytes: int | None = field(
        default=None,
        metadata={
            "optional": True,
            "doc": "GPU activation memory the engine asks for when it is loaded, once a GPU worker has seen it",
        },
    )
    # See ``engine_profiles``.
    profiles: list[dict[str, dict[str, list[int]]]] = field(
        default_factory=list,
        metadata={
            "optional": True,
            "doc": "the optimization profiles it was built with: per input, min/opt/max dims (min = opt = max for a "
            "static input); empty when not known",
        },
    )
    # See enginefarm.measure.ort_cuda_runner.SessionChoice.
    run_options: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "optional": True,
            "doc": "an onnxruntime/cuda artifact: the CUDA provider options its GPU worker measured fastest among "
            "those that pass its check (prefer_nhwc, enable_cuda_graph), to add to the session that loads it; "
            "empty: the provider's defaults, or not measured yet",
        },
    )

    @classmethod
    def of(cls, source: Any) -> EngineDescriptor:
        """The facts of whatever carries them under their names: a catalog row, a plain row of its columns, or a
        mapping (an API answer, a cached record; a fact it lacks takes its default)."""
        if isinstance(source, Mapping):
            given = {name: source[name] for name in ENGINE_FACTS if name in source}
        else:
            given = {name: getattr(source, name) for name in ENGINE_FACTS}
        for name in JSON_FACTS:  # JSON columns: a row may hold null
            if name in given:
                given[name] = dict(given[name] or {}) if name in DICT_FACTS else list(given[name] or [])
        return cls(**given)

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> EngineDescriptor:
        """The facts in ENGINE_FACTS' order (a plain row's columns, sliced): resolution's hot path, positional, with
        the JSON columns' nulls read as empty."""
        e = cls(*values)
        e.compute_capabilities = e.compute_capabilities or []
        e.profiles = e.profiles or []
        e.run_options = e.run_options or {}
        return e

    def facts(self) -> dict[str, Any]:
        """Each fact by its name: what an engine row is made of."""
        return asdict(self)


# The names of an engine's facts, in EngineDescriptor's order.
ENGINE_FACTS: tuple[str, ...] = tuple(f.name for f in fields(EngineDescriptor))
# The facts the catalog keeps as JSON.
JSON_FACTS = ("compute_capabilities", "profiles", "run_options")
DICT_FACTS = ("run_options",)
