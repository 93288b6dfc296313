"""Every bench/ script keeps running: the test command runs each one's smoke mode (seconds, tiny sizes) and
checks only that it completes and prints its ratios. bench/models.py has its own (tests/realmodels). Not here:
bench/gpu_timing.py, which needs an NVIDIA GPU (docs/gpu-timing.md has its runs on an H100)."""

from __future__ import annotations

import os
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


def test_no_bench_shares_a_redis_db_with_a_session_farm():
    """A bench smoke that flushed a session farm's Redis db (bench/load.py used 13, the second worker's) lost that
    farm's queued builds, which waited for the reconciler: the load smoke took 299 s in a run where alone it took 44."""
    import re

    from tests.conftest import REDIS_DB

    session_dbs = {REDIS_DB - 2 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) + 2 * w
                   for w in range(2)}  # fmt: skip
    used = {}
    for script in sorted((ROOT / "bench").glob("*.py")):
        for m in re.finditer(r'REDIS_DB", "(\d+)"\)|^REDIS_DB = (\d+)$', script.read_text(), re.M):
            used[script.name] = int(m.group(1) or m.group(2))
    assert used, "no bench names its Redis db"
    clashes = {name: db for name, db in used.items() if db in session_dbs}
    assert not clashes, f"benches on a session farm's Redis db {sorted(session_dbs)}: {clashes}"
