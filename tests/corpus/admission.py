"""Requests past the admission limits: too many queued builds, too many uploads at once, builds for
targets no live worker serves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.corpus import PROFILE, Context, E, Entry, Request, build

UNSERVED = "tensorrt/sm90"  # the test farm's workers build TensorRT-RTX and ONNX Runtime targets only
NO_WORKER = f"no live worker serves {UNSERVED}"


def sweep_for(targets: list[str], **body: Any) -> Callable[[Context], Request]:
    """A two-variant sweep of the context's model on these targets."""

    def make(ctx: Context) -> Request:
        return Request(
            "POST",
            "/v1/sweeps",
            {
                "json": {
                    "model_id": ctx.model_id,
                    "targets": targets,
                    "spec": {"profiles": PROFILE},
                    "axes": {"optimization_level": [1, 3]},
                    **body,
                }
            },
        )

    return make


ENTRIES: list[Entry] = [
    E("build-for-unserved-target", "admission", build(targets=[UNSERVED]), 409, NO_WORKER),
    E(
        "build-with-one-unserved-target",
        "admission",
        build(targets=["tensorrt-rtx/sm86", "tensorrt-rtx/sm121"]),
        409,
        "no live worker serves tensorrt-rtx/sm121; live workers serve",
    ),
    E("build-unserved-says-how-to-queue", "admission", build(targets=[UNSERVED]), 409, '"queue_without_worker": true'),
    E(
        "build-unserved-queue-flag-false",
        "admission",
        build(targets=[UNSERVED], queue_without_worker=False),
        409,
        NO_WORKER,
    ),
    E("sweep-for-unserved-target", "admission", sweep_for([UNSERVED]), 409, NO_WORKER),
]
