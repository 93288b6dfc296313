"""What kind of artifact a file is, told from its name, from the catalog's record and from its bytes, so that
``fetch`` never writes one kind of file under a name that says another.

The farm hands out two kinds: TensorRT and TensorRT-RTX plans (``.plan``) and ONNX Runtime artifacts (``.onnx``).
An ONNX file is a serialized ``onnx.ModelProto``; it is recognised here by walking the protobuf's top-level fields,
which needs no onnx package (the client installs without it): the walk must end exactly at the end of the file,
every field ModelProto declares must have its wire type (a field a later onnx adds is stepped over), and
``ir_version`` and ``graph`` must be there. A TensorRT plan is not protobuf and fails the walk at once: it opens
with ``vtrt``/``ftrt``, which read as a field of wire type 6, which protobuf does not have.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO

from enginefarm.client.cache import EngineCache
from enginefarm.client.safepaths import in_folder, inside, safe_name, write_text
from enginefarm.core.errors import IntegrityError, WrongArtifact
from enginefarm.core.ortcuda import known_run_options

ONNX, PLAN = "onnx", "plan"
# What each backend's artifact is.
KIND_OF_BACKEND = {"onnxruntime": ONNX, "tensorrt": PLAN, "tensorrt-rtx": PLAN}
SUFFIX = {ONNX: ".onnx", PLAN: ".plan"}
# File names that say what they hold; any other name (".bin", none) claims nothing.
KIND_OF_SUFFIX = {".onnx": ONNX, ".plan": PLAN, ".engine": PLAN, ".trt": PLAN}
WHAT = {ONNX: "an ONNX Runtime model", PLAN: "a TensorRT engine"}

# onnx.proto's ModelProto: field number -> wire type (0 varint, 2 length-delimited).
MODEL_PROTO_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}
IR_VERSION, GRAPH = 1, 7
FIXED_WIDTH = {1: 8, 5: 4}  # wire types 1 (64-bit) and 5 (32-bit): bytes to step over
# ONNX's IR versions are small integers (11 in onnx 1.18); a larger value is no ONNX file's.
MAX_IR_VERSION = 1000
# A hostile file with millions of tiny fields is judged after this many: real models have a few dozen.
MAX_TOP_LEVEL_FIELDS = 1 << 16


def kind_of_backend(backend: str | None) -> str | None:
    return KIND_OF_BACKEND.get(backend or "")


def default_name(engine: dict[str, Any]) -> str:
    """The file ``fetch`` writes when given no name: the model and target made a strict name
    (``safepaths.safe_name``), and the suffix of what it is, from the backend (a plan for any other)."""
    target = str(engine.get("target") or "engine").replace("/", "-")
    stem = safe_name(f"{engine.get('model_name') or 'model'}-{target}", "engine")
    return stem + SUFFIX[kind_of_backend(engine.get("backend")) or PLAN]


def _varint(fh: BinaryIO) -> int | None:
    """A protobuf base-128 varint from ``fh``; None at a clean end of file or on a malformed one."""
    value = shift = 0
    for _ in range(10):
        byte = fh.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
    return None


def is_onnx_model(path: Path | str) -> bool:
    """Whether the file is a serialized ONNX ModelProto, judged by its top-level protobuf fields alone."""
    path = Path(path)
    size = path.stat().st_size
    seen: set[int] = set()
    ir_version = None
    with open(path, "rb") as fh:
        for _ in range(MAX_TOP_LEVEL_FIELDS):
            if fh.tell() == size:
                break
            key = _varint(fh)
            if key is None:
                return False
            number, wire = key >> 3, key & 7
            if number == 0 or wire not in (0, 1, 2, 5) or MODEL_PROTO_FIELDS.get(number, wire) != wire:
                return False
            value = None
            if wire == 0 and (value := _varint(fh)) is None:
                return False
            if wire == 2 and (length := _varint(fh)) is None:
                return False
            step = FIXED_WIDTH.get(wire) or ((length or 0) if wire == 2 else 0)
            if fh.tell() + step > size:
                return False
            fh.seek(step, 1)
            if number == IR_VERSION:
                ir_version = value
            seen.add(number)
        else:
            return False
    return GRAPH in seen and ir_version is not None and 1 <= ir_version <= MAX_IR_VERSION


def kind_of_file(path: Path | str) -> str:
    """``onnx`` for an ONNX model, ``plan`` for anything else (the farm hands out nothing else)."""
    return ONNX if is_onnx_model(path) else PLAN


def check_name(engine: dict[str, Any], dest: Path | str) -> None:
    """Raise WrongArtifact when ``dest``'s name says another kind of file than the engine the farm chose is."""
    claimed, kind = KIND_OF_SUFFIX.get(Path(dest).suffix.lower()), kind_of_backend(engine.get("backend"))
    if claimed is None or kind is None or claimed == kind:
        return
    right = Path(dest).with_suffix(SUFFIX[kind]).name
    raise WrongArtifact(
        f"not writing {Path(dest).name}: the farm chose engine {engine.get('id')} ({engine.get('target')}), "
        f"{WHAT[kind]}, and the name says {WHAT[claimed]}; write it as {right}",
        engine_id=engine.get("id"),
        target=engine.get("target"),
    )


def check_bytes(engine: dict[str, Any], path: Path | str) -> None:
    """Raise IntegrityError when the downloaded bytes at ``path`` are not the kind of file the engine's record says."""
    kind = kind_of_backend(engine.get("backend"))
    if kind is None:
        return
    found = kind_of_file(path)
    if found != kind:
        raise IntegrityError(
            f"engine {engine.get('id')} ({engine.get('target')}) is recorded as {WHAT[kind]} but its bytes are "
            f"{'an ONNX model' if found == ONNX else 'not an ONNX model'}; nothing was written",
            sha256=engine.get("sha256"),
        )


def destination(engine: dict[str, Any], dest: Path | str | None) -> Path:
    """Where ``fetch`` writes ``engine``: ``dest``, or in the folder ``dest`` (default: here) the file named by
    what it is. Raises WrongArtifact when ``dest``'s name says another kind of file."""
    if dest is None or Path(dest).is_dir():
        return in_folder(dest or ".", default_name(engine))
    check_name(engine, dest)
    return inside(Path(dest).parent, dest)


def place_cached(cache: EngineCache, engine: dict[str, Any], dest: Path | str | None) -> Path:
    """Copy a cached engine to ``dest`` (see ``destination``) once its bytes are the kind its record says; a blob
    that is not is evicted, and nothing is written. Returns the path written."""
    dest = destination(engine, dest)
    try:
        check_bytes(engine, cache.path(engine["sha256"]))
    except IntegrityError:
        cache.evict(engine["sha256"])
        raise
    except FileNotFoundError:
        pass  # copy_to says the engine is not cached, in its words
    return cache.copy_to(engine["sha256"], dest)


# Beside an onnxruntime/cuda artifact, what to load it with: the CUDA provider options its GPU worker measured
# fastest among those that pass its check (EngineDescriptor.run_options).
SESSION_FILE_SUFFIX = ".session.json"
SESSION_FORMAT = "enginefarm-session/1"


def session_file(path: Path | str) -> Path:
    """The file beside ``path`` that says how to load it: ``<name>.session.json``."""
    path = Path(path)
    return path.with_name(path.name + SESSION_FILE_SUFFIX)


def write_session_file(engine: dict[str, Any], path: Path | str) -> Path | None:
    """Write (or, for an engine that runs best on the defaults, remove) the session file beside a fetched
    ``onnxruntime/cuda`` artifact. Its name comes from ``path``, never from the answer; only known options with the
    values "0" or "1" are written. Returns the file written, or None."""
    side = session_file(path)
    kept = known_run_options(engine.get("run_options"))
    if not str(engine.get("target") or "").startswith("onnxruntime/cuda-") or not kept:
        if side.is_file() and not side.is_symlink():
            side.unlink()
        return None
    record = {
        "format": SESSION_FORMAT,
        "engine": engine.get("id"),
        "sha256": engine.get("sha256"),
        "provider": "CUDAExecutionProvider",
        "provider_options": kept,
        "note": "add provider_options to the CUDA provider's options of the session that loads the file; "
        "enable_cuda_graph needs static input shapes and inputs and outputs bound at fixed device addresses "
        "(I/O binding)",
    }
    write_text(side, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return side
