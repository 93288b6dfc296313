"""Constants and small helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

# Two workers with different target sets: the e2e tests check that routing respects them.
WORKER_A = ["tensorrt-rtx/sm80", "tensorrt-rtx/sm86"]
WORKER_B = ["tensorrt-rtx/sm89", "tensorrt-rtx/sm120", "onnxruntime/cpu-x86_64"]
# The test farm's upload limit: the real-model corpus's largest file (BERT, 17.6 MB) fits.
UPLOAD_LIMIT = 32 << 20


def unique_name(prefix: str = "m") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_cli(url: str, *args: str, cache_dir: Path | None = None, expect: int = 0, stderr: bool | None = None) -> str:
    """Run ``enginefarm ARGS --api URL`` as a user would; returns its stdout (and stderr, by default when it
    is expected to fail) with whitespace collapsed."""
    env = os.environ | ({"ENGINEFARM_CACHE_DIR": str(cache_dir)} if cache_dir else {})
    out = subprocess.run(
        [sys.executable, "-m", "enginefarm", *args, "--api", url], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == expect, out.stdout + out.stderr
    text = out.stdout + (out.stderr if (expect != 0 if stderr is None else stderr) else "")
    return " ".join(text.split())


def rtx_build(path: Path, shapes: dict[str, tuple], arch: str = "sm86") -> tuple[bool, str]:
    """Build ``path`` as it is (fp32 spec: no conversion) for TensorRT-RTX ``arch`` through the farm's own build stage,
    ahead of time without a GPU; ``shapes`` maps inputs to (min, opt, max). Returns (built, the failure's message)."""
    import tempfile

    from enginefarm.core.domain import Target
    from enginefarm.core.errors import BuildFailed
    from enginefarm.core.spec import BuildSpec
    from worker.backends.base import BuildLog
    from worker.pipeline import engine_from_model

    spec = BuildSpec(
        profiles=[
            {name: {"min": list(lo), "opt": list(opt), "max": list(hi)} for name, (lo, opt, hi) in shapes.items()}
        ]
    )
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        try:
            engine_from_model(path, spec, Target.parse(f"tensorrt-rtx/{arch}"), None, Path(scratch), BuildLog())
        except BuildFailed as exc:
            return False, exc.message
    return True, ""


# --------------------------------------------------------------------------- catalog rows without bytes

RTX_VERSION = "1.7.1.116"
# A complete model record (what /v1/models lists), for rows a test writes straight into a catalog of its own.
ROW_INFO = {"inputs": [], "outputs": [], "opset": 17, "ir_version": 8, "producer": "test"}


def catalog_model(s, name: str, sha: str, version: str = "1", seq: int = 1):
    """A model row, as an upload writes it, in session ``s``; returns it (flushed, with its id)."""
    from storage.tables import ModelRow

    row = ModelRow(
        name=name, version=version, seq=seq, sha256=sha, format="onnx", blob_key=f"models/{sha}", size=1, info=ROW_INFO
    )
    s.add(row)
    s.flush()
    return row


def catalog_engine(s, model, arch: str, *, precision: str = "fp16", spec_hash: str = "0" * 64) -> int:
    """An engine row of ``model``'s bytes, as a worker writes it: TensorRT-RTX for ``arch`` ("sm86"), or the CPU
    artifact for "cpu". Its blob does not exist: keep such rows out of the session farm's catalog."""
    from storage.tables import EngineRow

    cpu = arch == "cpu"
    cc = None if cpu else f"{arch[2:-1]}.{arch[-1]}"
    row = EngineRow(
        model_id=model.id,
        model_sha256=model.sha256,
        spec_hash=spec_hash,
        target="onnxruntime/cpu-x86_64" if cpu else f"tensorrt-rtx/{arch}",
        backend="onnxruntime" if cpu else "tensorrt-rtx",
        backend_version="1.23.2" if cpu else RTX_VERSION,
        precision=precision,
        compute_capability=cc,
        compute_capabilities=[cc] if cc else [],
        platform="x86_64",
        trt_version=None if cpu else RTX_VERSION,
        sha256=uuid.uuid4().hex * 2,
        size=1,
        blob_key=f"engines/{uuid.uuid4().hex}",
        build_seconds=0.1,
    )
    s.add(row)
    s.flush()
    return row.id


def python(version: str) -> str:
    """An interpreter of this version: this one, a pyenv install, or one on PATH."""
    import shutil

    if sys.version_info[:2] == tuple(map(int, version.split("."))):
        return sys.executable
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    found = str(pyenv[-1]) if pyenv else shutil.which(f"python{version}")
    assert found, f"python{version} is needed to check the client on it (pyenv install {version})"
    return found
