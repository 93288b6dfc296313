"""The soak's smoke: both farms, side by side, under the mixed workload for about two and a half minutes, a worker
killed and the API restarted on the way, the reconciler every 0.5 s so that a leak of anything per pass shows within
the run (bench/soak.py). Each must pass, print its summary and draw its plots."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_soak_smoke_passes_in_both_modes(tmp_path):
    modes = ("embedded", "distributed")
    runs = {}
    for mode in modes:  # at once: two farms of their own, and the machine's two cores both busy, as in a real soak
        with open(tmp_path / f"{mode}.log", "w") as log:
            runs[mode] = subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / "soak.py"), "--mode", mode, "--smoke", "--out", str(tmp_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
    codes = {mode: run.wait(timeout=1200) for mode, run in runs.items()}
    for mode in modes:
        out = (tmp_path / f"{mode}.log").read_text()
        print(out[-6000:])
        assert codes[mode] == 0, out[-6000:]
        assert f"soak: {mode} worst slope/day ratio" in out, out[-3000:]
        assert f"soak: {mode} PASS" in out
        pngs = {p.name for p in (tmp_path / mode).glob("*.png")}
        assert {"rss_mb.png", "fds.png", "threads.png", "queue.png", "disk_mb.png"} <= pngs, pngs
        assert (tmp_path / mode / "soak.json").stat().st_size > 0
