"""Every bench/ script keeps running: the test command runs each one's smoke mode (seconds, tiny sizes) and
checks only that it completes and prints its ratios. bench/models.py has its own (tests/realmodels). Not here:
bench/gpu_timing.py, which needs an NVIDIA GPU (docs/gpu-timing.md has its runs on an H100)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "script,says",
    [
        ("serve.py", "ratio ours/baseline p50"),
        ("resolve.py", "resolve/base"),
        ("benchmark_overhead.py", "ratio"),
        ("e2e.py", "c/(a+b)"),
        ("load.py", "farm / baseline"),
        ("upload.py", "upload/floor"),
        ("fleet.py", "conditional/cold CPU per request"),
        ("tail.py", "resolve/healthz p99"),
        ("edge.py", "route/304 CPU per request"),
        ("appcpu.py", "hop executor/anyio"),
    ],
)
def test_bench_smoke(script, says, tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--smoke"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert says in done.stdout, done.stdout[-3000:]
    print(done.stdout[-1500:])
