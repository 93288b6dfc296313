"""What the benchmark stage's measurement adds on top of running the engine.

Baseline: a bare ``session.run`` loop over the same ONNX Runtime engine and inputs, timed with
``time.perf_counter``, for the same number of iterations. Measured: ``worker.measure.evaluate.OrtRunner.benchmark``
(trtexec's loop, io-binding, four clock reads per iteration, the summary). Both run in this process, one
after the other and then in the opposite order, and the script prints median(measured) / median(baseline)
per model size. A ratio near 1.0 means the numbers the farm stores are the engine's, not the harness's.

    .venv/bin/python bench/benchmark_overhead.py [--seconds 3] [--sizes 16 64 256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from enginefarm.core.domain import ModelInfo, Target
from enginefarm.core.spec import BenchmarkSpec, BuildSpec
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.graph.samples import sample_spec, save_conv_net
from enginefarm.measure.inputs import random_inputs
from enginefarm.measure.ort_runner import OrtRunner
from worker.backends import BuildLog
from worker.pipeline import engine_from_model


def bare_loop(runner: OrtRunner, inputs: dict, iterations: int) -> list[float]:
    out = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        runner.session.run(runner.outputs, inputs)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def one_size(channels: int, seconds: float, work: Path) -> dict:
    model = save_conv_net(work / f"m{channels}.onnx", channels=channels, blocks=3)
    info: ModelInfo = inspect_upload(model, work).info
    spec = BuildSpec(**sample_spec())
    built = engine_from_model(model, spec, Target.parse("onnxruntime/cpu-x86_64"), None, work, BuildLog())
    runner = OrtRunner(built.path)
    inputs = random_inputs(info, {"input": [4, 3, 32, 32]}, seed=0)
    bench = BenchmarkSpec(duration_s=seconds)
    first = runner.benchmark(inputs, bench)
    n = len(first.iterations)
    base = bare_loop(runner, inputs, n)
    second = runner.benchmark(inputs, bench)  # the opposite order too: no drift counts for one side only
    base2 = bare_loop(runner, inputs, n)
    measured = statistics.median([it.e2e for it in first.iterations + second.iterations])
    baseline = statistics.median(base + base2)
    return {
        "channels": channels,
        "iterations": n,
        "measured_ms": measured,
        "baseline_ms": baseline,
        "ratio": measured / baseline,
        "threads": runner.threads,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--smoke", action="store_true", help="one small size for 0.2 s: checks that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.seconds = [16], 0.2
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'channels':>8} {'iters':>6} {'threads':>7} {'bare run ms':>12} {'harness ms':>11} {'ratio':>6}")
        for size in args.sizes:
            r = one_size(size, args.seconds, Path(tmp))
            print(
                f"{r['channels']:>8} {r['iterations']:>6} {r['threads']:>7} {r['baseline_ms']:>12.4f} "
                f"{r['measured_ms']:>11.4f} {r['ratio']:>6.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
