"""`enginefarm demo`: the embedded mode (SQLite, local blobs, database broker) end to end, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from enginefarm.config import Settings
from storage import catalog
from storage.blobs.base import sha256_file
from storage.db import session_scope


def test_demo_builds_five_targets_and_fetches_sm86(tmp_path):
    out = subprocess.run([sys.executable, "-m", "enginefarm.cli", "demo", "--data-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = " ".join(out.stdout.split())
    assert "matches the catalog" in text and "fetched again: from the local cache, no download" in text
    assert "tensorrt-rtx/sm86 (rule rtx-cc): TensorRT-RTX engine built for compute capability 8.6, you have 9.0" in text
    assert (tmp_path / "triton" / "convnet" / "config.pbtxt").is_file()
    assert len(list((tmp_path / "triton" / "convnet" / "1").glob("model_sm*.plan"))) == 4

    settings = Settings(data_dir=tmp_path)
    with session_scope(settings) as s:
        pairs, total = catalog.list_engines(s, model="convnet")
        engines = [e for e, _ in pairs]
        assert total == 5
        assert {e.target for e in engines} >= {"tensorrt-rtx/sm80", "tensorrt-rtx/sm86", "tensorrt-rtx/sm89", "tensorrt-rtx/sm120"}
        sm86 = next(e for e in engines if e.target == "tensorrt-rtx/sm86")
    fetched = tmp_path / "fetched" / "convnet-sm86.plan"
    assert sha256_file(fetched) == sm86.sha256
    # The local blob directory holds each engine under its content address, and the model.
    blobs = sorted(p for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    assert len(blobs) == 6
