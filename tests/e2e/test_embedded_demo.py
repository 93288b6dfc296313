"""`enginefarm demo`: the embedded mode (SQLite, local blobs, database broker) end to end, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from enginefarm.core.config import Settings
from enginefarm.core.hashing import sha256_file
from enginefarm.core.wanted import EngineFilter
from storage import builtengines
from storage.db import session_scope


def test_demo_builds_five_targets_and_fetches_sm86(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "enginefarm", "demo", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = " ".join(out.stdout.split())
    assert "matches the catalog" in text and "fetched again: from the local cache, no download" in text
    assert "tensorrt-rtx/sm86 (rule rtx-cc): TensorRT-RTX engine built for compute capability 8.6, you have 9.0" in text
    assert (tmp_path / "triton" / "convnet" / "config.pbtxt").is_file()
    assert len(list((tmp_path / "triton" / "convnet" / "1").glob("model_sm*.plan"))) == 4

    settings = Settings(data_dir=tmp_path)
    with session_scope(settings) as s:
        pairs, total = builtengines.list_engines(s, EngineFilter(model="convnet"))
        engines = [e for e, _ in pairs]
        assert total == 5
        assert {e.target for e in engines} >= {
            "tensorrt-rtx/sm80",
            "tensorrt-rtx/sm86",
            "tensorrt-rtx/sm89",
            "tensorrt-rtx/sm120",
        }
        sm86 = next(e for e in engines if e.target == "tensorrt-rtx/sm86")
    fetched = tmp_path / "fetched" / "convnet-sm86.plan"
    assert sha256_file(fetched) == sm86.sha256
    # The local blob directory holds each engine under its content address, the model, and the reference outputs
    # of its accuracy check (one: every target's check feeds the same inputs).
    blobs = sorted(p.relative_to(tmp_path / "blobs") for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    kinds = sorted(p.parts[0] for p in blobs)
    assert kinds == ["engines"] * 5 + ["models", "references"], blobs


def test_demo_without_tensorrt_rtx_says_so_and_shows_the_cpu_path(tmp_path):
    """A machine where tensorrt_rtx does not import (as after `pip install enginefarm[server,worker]`): the demo
    says why it builds no GPU engine and which extra adds them, then runs the rest of the path."""
    blocker = tmp_path / "site"
    blocker.mkdir()
    # Every process of the demo (CLI, API, worker) starts with tensorrt_rtx unimportable.
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoRtx:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'tensorrt_rtx':\n"
        "            raise ModuleNotFoundError(\"No module named 'tensorrt_rtx'\", name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NoRtx())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run(
        [sys.executable, "-m", "enginefarm", "demo", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    text = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "TensorRT-RTX is not installed here" in text and "pip install 'enginefarm[rtx]'" in text
    assert "matches the catalog" in text and "tensorrt-rtx" not in text.split("2. build", 1)[1].split("3.")[0]
    with session_scope(Settings(data_dir=tmp_path / "data")) as s:
        pairs, total = builtengines.list_engines(s, EngineFilter(model="convnet"))
    assert total == 1 and pairs[0][0].target.startswith("onnxruntime/cpu-")
    assert (tmp_path / "data" / "fetched" / "convnet-cpu.onnx").is_file()
