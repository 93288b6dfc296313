"""bench/models.py keeps running: its smoke mode builds one corpus model alone and through an embedded farm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_models_bench_smoke(tmp_path):
    out = tmp_path / "models.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "models.py"), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["models"]["ppocr-cls"]["tensorrt-rtx/sm86"] > 0
    task = result["farm"]["tasks"]["tensorrt-rtx/sm86"]
    assert task["run_s"] >= task["build_s"] > 0  # the worker's time includes the builder's
    assert result["farm_over_builders"] > 1 and "ratio" in done.stdout
