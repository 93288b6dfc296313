"""Real models: build seconds per model and target, and what the farm adds per task over the builder alone.

Part 1, for every corpus model (tests/realmodels) and target, times the builder alone: the farm's own build stage
(``worker.pipeline.engine_from_model``) in this process, fp32, from a local file.

Part 2, on the largest corpus model, runs the same builds through an embedded farm (the real API process and a
Celery worker process, SQLite, local blobs) from upload to every task catalogued, and prints the farm's wall time
against the builder alone measured in the same run, and per task the worker's run time minus the builder's.
Benchmarks and accuracy checks are switched off in part 2: it measures the build path only.

Part 3 times, per model, the CPU int8 artifact against the fp32 one, both made by the farm's own stages in this
process: the quantize stage's ONNX Runtime recipe (``worker.int8.quantize``, calibrated on 16 of the model's samples,
one for a streaming model), the ONNX Runtime build stage, and the benchmark stage's runner, timed interleaved
(``worker.measure.int8_vs_fp32``, the code that puts ``vs_fp32`` on an int8 engine's benchmark). It prints int8/fp32 as
speed-ups from one run, with the int8 output's cosine against fp32, and the same two timed each alone afterwards
(``alone``): where the two speed-ups differ by more than a fifth the row says "disagrees". The corpus plus
ResNet-50, ConvNeXt-Tiny and a GPT-2 style decoder (``tests/realmodels/large.py``).

    .venv/bin/python bench/models.py                 # every model, 5 targets, then the farm on the largest
    .venv/bin/python bench/models.py --smoke         # one small model, one target: the test command runs this
    .venv/bin/python bench/models.py --int8-only     # part 3 alone: int8 against fp32 per model
    .venv/bin/python bench/models.py --json out.json
    .venv/bin/python bench/models.py --save-models DIR --models a b   # files and samples for another machine
    python bench/models.py --int8-only --models-dir DIR               # there: part 3 on the files brought
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from enginefarm.core.domain import Target  # noqa: E402
from enginefarm.core.spec import BuildSpec  # noqa: E402
from tests.realmodels import (  # noqa: E402
    MODELS,
    large,
    path,
    samples,
)
from worker.backends import BuildLog  # noqa: E402
from worker.pipeline import engine_from_model  # noqa: E402

TARGETS = [
    "tensorrt-rtx/sm80",
    "tensorrt-rtx/sm86",
    "tensorrt-rtx/sm89",
    "tensorrt-rtx/sm120",
    "onnxruntime/cpu-x86_64",
]
console = Console(width=150)


def spec_of(name: str) -> dict:
    model = MODELS[name]
    return {**model.shapes, **model.spec, "benchmark": {"enabled": False}, "accuracy": {"enabled": False}}


def builder_alone(name: str, targets: list[str], work: Path, repeat: int) -> dict[str, float]:
    """Median builder seconds per target (the build stage in this process, fp32)."""
    spec, model = BuildSpec(**spec_of(name)), path(name)
    out = {}
    for text in targets:
        runs = []
        for i in range(repeat):
            scratch = work / f"{name}-{text.replace('/', '_')}-{i}"
            scratch.mkdir(parents=True)
            runs.append(engine_from_model(model, spec, Target.parse(text), None, scratch, BuildLog()).seconds)
            shutil.rmtree(scratch)
        out[text] = statistics.median(runs)
    return out


def through_the_farm(name: str, targets: list[str], work: Path) -> dict:
    """Upload → build → every task final on an embedded farm; the catalog's per-task times."""
    # Imported here so that part 3 alone (--int8-only) needs only the worker's packages, not the server's.
    from enginefarm.client import Client
    from enginefarm.core.config import Settings
    from server.embedded import Farm, embedded_env, issue_token

    data = work / "farm"
    env = embedded_env(data)
    token = issue_token(Settings(data_dir=data, blob_store="local"), "bench", ["admin"])
    farm = Farm(env, log_dir=work, token=token)
    try:
        farm.start_api()
        farm.start_worker("bench", targets, concurrency=1, bench_targets=[])
        farm.wait_workers(["bench"])
        with Client(farm.url, token=token) as c:
            started = time.perf_counter()
            model, _ = c.upload(path(name), f"bench-{name}")
            build = c.build(model["id"], targets, spec_of(name))
            done = c.wait_build(build["id"], timeout=1800, poll=0.05)
            wall = time.perf_counter() - started
            tasks = {}
            for t in done["tasks"]:
                if t["state"] != "succeeded":
                    raise RuntimeError(f"{t['target']}: {t['state']} {t['error']}")
                engine = c.get(f"/v1/engines/{t['engine_id']}")
                tasks[t["target"]] = {
                    "run_s": t["run_seconds"],
                    "build_s": engine["build_seconds"],
                    "wait_s": t["wait_seconds"],
                }
        return {"wall_s": wall, "tasks": tasks}
    finally:
        farm.stop()


# --models-dir: ONNX files and samples brought from another machine (one without the network or the exporters'
# versions): DIR/NAME.onnx replaces the cached file, DIR/NAME-COUNT-SEED.npz the sampler's output for that call.
MODELS_DIR: Path | None = None


def _model(name: str):
    """The corpus entry, file and sampler of a model of either list."""
    model, source, sampler = (
        (large.LARGE[name], large.path, large.samples) if name in large.LARGE else (MODELS[name], path, samples)
    )
    given = MODELS_DIR / f"{name}.onnx" if MODELS_DIR else None
    if not given or not given.exists():
        return model, source(name), sampler

    def brought(name: str, count: int, seed: int):
        saved = MODELS_DIR / f"{name}-{count}-{seed}.npz"
        if not saved.exists():
            return sampler(name, count, seed=seed)
        with np.load(saved) as data:
            return {k: data[k] for k in data.files}

    return model, given, brought


def save_models(names: list[str], out: Path) -> None:
    """Write what --models-dir reads for part 3: each model's ONNX file and the samples part 3 draws."""
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        model, source, sampler = _model(name)
        shutil.copyfile(source, out / f"{name}.onnx")
        batch = next(iter(model.opt_shapes().values()))[0] or 1
        for count, seed in ((1 if model.batch_axes else 16, 1), (batch, 9)):
            np.savez(out / f"{name}-{count}-{seed}.npz", **sampler(name, count, seed=seed))
        console.print(f"{name}: {source.stat().st_size / 1e6:.1f} MB")


def int8_vs_fp32(name: str, work: Path, rounds: int, repair: bool = False) -> dict:
    """The CPU int8 artifact against the fp32 one, as the farm makes and times them, interleaved. With ``repair``,
    the quantize stage's accuracy repair runs first and its kept layers stay float in the artifact timed."""
    from enginefarm.graph.modelfile import inspect_upload
    from enginefarm.measure.ort_runner import OrtRunner
    from worker.backends.base import BuildBackend
    from worker.cleanup import prepared_model
    from worker.int8.choice import quantize_for_cpu
    from worker.measure import int8_vs_fp32 as compare

    model, source, sampler = _model(name)
    spec = BuildSpec(**{**model.shapes, **model.spec, "benchmark": {"enabled": False}, "accuracy": {"enabled": False}})
    target = Target.parse(f"onnxruntime/cpu-{BuildBackend.host_platform()}")
    work.mkdir(parents=True)
    fixed = set(spec.fixed_inputs)
    # A model whose state batches on another axis than its input (Silero's [2, batch, 128]) streams one chunk.
    calibration = {k: v for k, v in sampler(name, 1 if model.batch_axes else 16, seed=1).items() if k not in fixed}
    started = time.perf_counter()
    float_model = prepared_model(source, spec, work, BuildLog())
    info = inspect_upload(source, work / "inspect").info
    repaired = None
    unrepaired_model = None
    if repair:
        from worker.int8.repair import repair as find_layers

        int8_check = spec.model_copy(update={"accuracy": spec.accuracy.model_copy(update={"enabled": True})})
        repaired = find_layers(
            float_model, calibration, int8_check, info, work, lambda p: OrtRunner(p), reference_model=source
        )
        if repaired["needed"] and repaired["kept"]:  # the int8 artifact as it would be without the repair
            (work / "u").mkdir()
            unrepaired_model = work / "u" / "int8.onnx"
            quantize_for_cpu(
                float_model, calibration, unrepaired_model, spec, info, work / "u", lambda p: OrtRunner(p), source
            )
        spec = spec.model_copy(update={"keep_fp32_layers": repaired["kept"]})
    report = quantize_for_cpu(
        float_model, calibration, work / "int8.onnx", spec, info, work, lambda p: OrtRunner(p), source
    )
    quantize_s = time.perf_counter() - started
    int8_spec = BuildSpec(**{**spec.model_dump(mode="json"), "precision": "int8"})
    (work / "a").mkdir(), (work / "b").mkdir()
    fp32 = engine_from_model(source, spec, target, None, work / "a", BuildLog())
    int8 = engine_from_model(work / "int8.onnx", int8_spec, target, None, work / "b", BuildLog())
    batch = next(iter(model.opt_shapes().values()))[0] or 1
    feed = {k: v for k, v in sampler(name, batch, seed=9).items() if k not in fixed}
    runners = [OrtRunner(int8.path), OrtRunner(fp32.path)]
    if unrepaired_model is not None:
        (work / "c").mkdir()
        unrepaired = engine_from_model(unrepaired_model, int8_spec, target, None, work / "c", BuildLog())
        runners.append(OrtRunner(unrepaired.path))
    a, b = runners[:2]
    try:
        got, want = next(iter(a.infer(feed).values())), next(iter(b.infer(feed).values()))
        got, want = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
        cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want) or 1.0))
        # All timed in one interleaved run: the repaired int8, fp32 and (after a repair) the unrepaired int8.
        timed = compare.interleaved_all([lambda r=r: r.infer(feed) for r in runners], rounds=rounds)
        int8_ms, fp32_ms = timed[0], timed[1]
        # The same two again, each alone for a while: a ratio that disagrees with the interleaved one means the
        # process or the machine was disturbed during one of them, and the row says so.
        alone = [
            statistics.median(compare.interleaved_all([lambda r=r: r.infer(feed)], rounds=1, block_s=1.0)[0])
            for r in runners[:2]
        ]
    finally:
        for r in runners:
            r.close()
    unrepaired_ms = statistics.median(timed[2]) if len(timed) > 2 else None
    figures = compare.verdict(int8_ms, fp32_ms, rounds)
    alone_speedup = alone[1] / alone[0]
    return {
        **figures,
        "alone_ms": {"int8": round(alone[0], 4), "fp32": round(alone[1], 4)},
        "alone_speedup": round(alone_speedup, 3),
        "consistent": abs(alone_speedup / figures["speedup"] - 1) <= ALONE_AGREES,
        "unrepaired_median_ms": unrepaired_ms,
        "cosine": cosine,
        "quantize_s": quantize_s,
        "int8_ops": report.op_types,
        "threads": a.threads,
        "candidates": report.candidates,
        "repair": repaired,
        "kept": next(c["name"] for c in report.candidates or [] if c.get("kept")),
    }


# How far the speed-up of each artifact timed alone may be from the interleaved one before the row is marked.
ALONE_AGREES = 0.2


def _candidates_text(candidates: list[dict]) -> str:
    """Each CPU candidate's speed-up on the quantize stage's own timing, and a cross where it failed the gate."""
    words = []
    for c in candidates:
        if "error" in c:
            words.append(f"{c['name']} error")
        else:
            words.append(f"{c['name']} {c['speedup']:.2f}x" + ("" if c["pass"] else f" FAIL cos {c['cosine']:.3f}"))
    return ", ".join(words)


def _repair_text(repair: dict | None) -> str:
    if not repair:
        return ""
    if not repair["needed"]:
        return "not needed"
    kept = f"{len(repair['kept'])} kept" if repair["passed"] else f"none of {repair['budget']} passes"
    return (
        f"{kept}, cos {repair['before']['cosine']:.3f} -> {repair['after']['cosine']:.3f}, "
        f"{repair['evaluations']} checks, {repair['seconds']:.0f} s = {repair['cost_in_checks']}x one check "
        f"({repair['check_seconds']:.1f} s)"
    )


def print_int8(results: dict) -> None:
    table = Table(title="CPU int8 against fp32, same process, interleaved (speed-up = fp32 median / int8 median)")
    for col in (
        "model",
        "kept",
        "fp32 ms",
        "int8 ms",
        "unrepaired int8 ms",
        "speed-up",
        "alone",
        "faster",
        "cosine",
        "quantize s",
        "threads",
        "candidates (quantize stage)",
        "repair",
    ):
        table.add_column(col)
    for n, r in results.items():
        if "error" in r:
            table.add_row(n, *["-"] * 12)
            continue
        table.add_row(
            n,
            r["kept"],
            f"{r['fp32_median_ms']:.2f}",
            f"{r['int8_median_ms']:.2f}",
            f"{r['unrepaired_median_ms']:.2f}" if r.get("unrepaired_median_ms") else "-",
            f"{r['speedup']:.2f}x",
            f"{r['alone_speedup']:.2f}x" + ("" if r["consistent"] else " (disagrees)"),
            "yes" if r["faster"] else "NO",
            f"{r['cosine']:.4f}",
            f"{r['quantize_s']:.1f}",
            str(r["threads"]),
            _candidates_text(r["candidates"]),
            _repair_text(r.get("repair")),
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one small model, one target, one repeat")
    parser.add_argument("--repeat", type=int, default=3, help="builder-alone repeats per model and target")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--int8-only", action="store_true", help="part 3 alone: int8 against fp32 per model")
    parser.add_argument("--repair", action="store_true", help="part 3 with the quantize stage's accuracy repair first")
    parser.add_argument("--models", nargs="*", help="part 3's models (default: the corpus and the larger networks)")
    parser.add_argument(
        "--all-optimizations",
        action="store_true",
        help="part 3 with ORT_ENABLE_ALL for int8 artifacts on CPUs without VNNI too (the CPU backend "
        "keeps the basic level there for models with Q/DQ): what that rule costs",
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        help="part 3 reads NAME.onnx and NAME-COUNT-SEED.npz from here where present (see --save-models)",
    )
    parser.add_argument(
        "--save-models",
        type=Path,
        metavar="DIR",
        help="write part 3's models (--models) and their samples to DIR for --models-dir, then stop",
    )
    args = parser.parse_args()
    global MODELS_DIR
    MODELS_DIR = args.models_dir
    if args.save_models:
        save_models(args.models or [*MODELS, *large.LARGE], args.save_models)
        return
    names = ["ppocr-cls"] if args.smoke else list(MODELS)
    targets = ["tensorrt-rtx/sm86"] if args.smoke else TARGETS
    repeat = 1 if args.smoke else args.repeat
    work = Path(tempfile.mkdtemp(prefix="bench-models-"))
    try:
        if args.all_optimizations:
            from enginefarm.measure import ort_runner

            ort_runner.cpu_has_vnni = lambda: True
        int8_names = args.models or (["ppocr-cls"] if args.smoke else [*MODELS, *large.LARGE])
        int8 = {}
        for n in int8_names:
            try:
                int8[n] = int8_vs_fp32(n, work / "int8" / n, 2 if args.smoke else 10, repair=args.repair)
            except Exception as exc:  # noqa: BLE001 - one model that cannot be quantized says why; the others go on
                int8[n] = {"error": f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"}
            console.print(n, json.dumps(int8[n]))
        print_int8(int8)
        if args.int8_only:
            if args.json:
                args.json.write_text(json.dumps({"int8_vs_fp32": int8}, indent=2))
            return
        per_model = {n: builder_alone(n, targets, work / "alone", repeat) for n in names}
        table = Table(title=f"builder alone, fp32, median of {repeat} (s)")
        table.add_column("model")
        for t in targets:
            table.add_column(t)
        for n, secs in per_model.items():
            table.add_row(n, *(f"{secs[t]:.2f}" for t in targets))
        console.print(table)

        largest = max(names, key=lambda n: path(n).stat().st_size)
        alone = builder_alone(largest, targets, work / "again", 1)  # the same run as the farm's
        farm = through_the_farm(largest, targets, work)
        builder_sum = sum(alone.values())
        overhead = [t["run_s"] - t["build_s"] for t in farm["tasks"].values()]
        result = {
            "models": per_model,
            "largest": largest,
            "size_mb": path(largest).stat().st_size / 1e6,
            "builder_alone_s": alone,
            "farm": farm,
            "farm_over_builders": farm["wall_s"] / builder_sum,
            "per_task_overhead_s": statistics.median(overhead),
            "int8_vs_fp32": int8,
        }
        console.print(
            f"{largest} ({result['size_mb']:.1f} MB), {len(targets)} target(s): farm {farm['wall_s']:.2f} s "
            f"upload to catalogued, builders alone {builder_sum:.2f} s: ratio "
            f"{result['farm_over_builders']:.2f}; per task the worker adds {result['per_task_overhead_s']:.3f} s "
            "(median of run time minus builder time)"
        )
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
