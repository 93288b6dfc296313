"""Test-only: a worker whose int8 quantization or benchmark can be interrupted. ``python -m tests.slow_stages worker
...`` runs the ``enginefarm worker`` command after wrapping the quantizer (``ENGINEFARM_TEST_QUANTIZE_DELAY_S``) and
the benchmark stage (``ENGINEFARM_TEST_BENCH_DELAY_S``) so each waits that many seconds before it runs for real: the
window in which a fault test kills the worker. Builds have ``tests.slow_backend``. Production code never names this
module."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable


def delayed(fn: Callable, env: str) -> Callable:
    """``fn``, run after waiting ``$env`` seconds."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        delay = float(os.environ.get(env, "0"))
        print(f"test hook: {fn.__module__}.{fn.__name__} waits {delay:g} s", flush=True)
        time.sleep(delay)
        return fn(*args, **kwargs)

    return wrapper


def install() -> None:
    """Wrap the stages where the worker's tasks look them up at each call (pool processes are forked from this one,
    so they inherit the wrapped functions)."""
    from worker.int8 import quantize
    from worker.measure import evaluate

    quantize.quantize_qdq = delayed(quantize.quantize_qdq, "ENGINEFARM_TEST_QUANTIZE_DELAY_S")
    evaluate.evaluate = delayed(evaluate.evaluate, "ENGINEFARM_TEST_BENCH_DELAY_S")


if __name__ == "__main__":
    install()
    from enginefarm.client.cli import main

    main()
