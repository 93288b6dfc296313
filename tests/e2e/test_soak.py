"""The soak's smoke: both farms under the mixed workload for about two and a half minutes each, a worker killed and
the API restarted on the way, the reconciler every 0.5 s so that a leak of anything per pass shows within the run
(bench/soak.py). It must pass, print its summary for both modes and draw its plots."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_soak_smoke_passes_in_both_modes(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--mode", "both", "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=tmp_path,
    )
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    for mode in ("embedded", "distributed"):
        assert f"soak: {mode} worst slope/day ratio" in done.stdout, done.stdout[-3000:]
        assert f"soak: {mode} PASS" in done.stdout
        pngs = {p.name for p in (tmp_path / mode).glob("*.png")}
        assert {"rss_mb.png", "fds.png", "threads.png", "queue.png", "disk_mb.png"} <= pngs, pngs
        assert (tmp_path / mode / "soak.json").stat().st_size > 0
