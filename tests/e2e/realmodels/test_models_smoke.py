"""bench/models.py keeps running: its smoke mode builds one corpus model alone and through an embedded farm, and
times its CPU int8 artifact against the fp32 one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_models_bench_smoke(tmp_path):
    out = tmp_path / "models.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "models.py"), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["models"]["ppocr-cls"]["tensorrt-rtx/sm86"] > 0
    task = result["farm"]["tasks"]["tensorrt-rtx/sm86"]
    assert task["run_s"] >= task["build_s"] > 0  # the worker's time includes the builder's
    # A ratio of two timings taken at different moments: its size is the bench's to report, not a test's to judge.
    assert result["farm_over_builders"] > 0 and "ratio" in done.stdout
    int8 = result["int8_vs_fp32"]["ppocr-cls"]
    assert int8["fp32_median_ms"] > 0 and int8["int8_median_ms"] > 0 and int8["int8_calls"] >= 2
    assert int8["faster"] == (int8["speedup"] > 1.0) and "int8 against fp32" in done.stdout
    alone = int8["alone_ms"]  # the cross-check: each timed alone, its ratio compared with the interleaved one
    assert alone["int8"] > 0 and alone["fp32"] > 0
    assert int8["alone_speedup"] == pytest.approx(alone["fp32"] / alone["int8"], rel=0.01)
    assert int8["consistent"] == (abs(int8["alone_speedup"] / int8["speedup"] - 1) <= 0.2)
    assert int8["int8_ops"].get("QLinearConv", 0) > 0  # every CPU candidate of a conv net has integer convolutions
    assert {c["name"] for c in int8["candidates"]} >= {"operator", "convolutions"} and int8["kept"] in (
        c["name"] for c in int8["candidates"] if c.get("kept")
    )


def test_models_dir_carries_files_and_samples(tmp_path):
    """--save-models writes what --models-dir reads; a run from it never touches the model cache (here a file, so
    that any use of the cache fails)."""
    brought = tmp_path / "brought"
    saved = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "models.py"), "--save-models", str(brought), "--models", "ppocr-cls"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert saved.returncode == 0, saved.stdout[-3000:] + saved.stderr[-3000:]
    assert sorted(p.name for p in brought.iterdir()) == ["ppocr-cls-16-1.npz", "ppocr-cls-4-9.npz", "ppocr-cls.onnx"]
    blocked = tmp_path / "no-cache"
    blocked.write_text("")
    out = tmp_path / "int8.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "models.py"),
            "--int8-only",
            "--models-dir",
            str(brought),
            "--models",
            "ppocr-cls",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "ENGINEFARM_MODEL_CACHE": str(blocked)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    int8 = json.loads(out.read_text())["int8_vs_fp32"]["ppocr-cls"]
    assert "error" not in int8, int8
    assert int8["fp32_median_ms"] > 0 and int8["int8_median_ms"] > 0 and int8["cosine"] > 0.9
