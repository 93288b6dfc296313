"""Constants and small helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import uuid

# Two workers with different target sets: the e2e tests check that routing respects them.
WORKER_A = ["tensorrt-rtx/sm80", "tensorrt-rtx/sm86"]
WORKER_B = ["tensorrt-rtx/sm89", "tensorrt-rtx/sm120", "onnxruntime/cpu-x86_64"]


def unique_name(prefix: str = "m") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
