"""What a team with a GPU and the PyTorch model would run instead of the farm's artifact: the anchors of the GPU matrix.

``python bench/torch_anchors.py NAME --samples S.npz --shapes JSON --seconds 3 --out OUT.json [--reference R.npz]
[--max-autotune]``

The torch model is built as the corpus exports it, with the same seeded random weights (tests/realmodels/export.py
for BERT and MobileNetV2; torchvision's ResNet-50 as bench/gpu_matrix.py exports it), and fed the same samples at the
same batch. Each way of running it is timed by the farm's own rules and statistics (enginefarm.core.stats: 200 ms of
warm-up, then at least ``--seconds`` and 10 iterations, trtexec's percentiles) with CUDA events on one stream around
the same phases as the farm's GPU timing: pinned host to device, the model, device to pinned host. TF32 is on, as in
the farm's artifacts. The ways:

- ``eager fp32``, ``eager fp16`` (autocast; channels-last for convolutional nets);
- ``compile fp32`` and ``compile fp16`` (``torch.compile``, inductor's default mode);
- ``compile fp32 reduce-overhead`` and ``compile fp16 reduce-overhead`` (inductor with CUDA graphs);
- ``compile fp16 max-autotune`` with ``--max-autotune`` (minutes of autotuning per model).

Each row keeps the first call's time (the compile), and how far its outputs are from eager fp32's. With
``--reference`` (the farm's reference for the model: ONNX Runtime FP32's outputs on the check's inputs, as
``GET /v1/engines/{id}/reference/content`` serves it), each way is also judged as the farm judges its artifacts: on
the same inputs, by the same code (``enginefarm.measure.check.judge``) and the same default limits for its
precision; an fp32 way that misses the fp32 limits with TF32 is judged again with TF32 off, as the farm's check does.
bench/gpu_matrix.py runs it for each model with a torch source and tables it beside the farm's artifacts.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from enginefarm.core import stats  # noqa: E402
from enginefarm.core.spec import DEFAULT_TOLERANCES  # noqa: E402
from enginefarm.measure import check  # noqa: E402

CONV_NETS = {"resnet50", "mobilenet-v2"}


def build(name: str) -> Any:
    import torch

    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None).eval()
    from tests.realmodels import export

    return {"bert": export.bert_model, "mobilenet-v2": export.mobilenet_v2_model}[name]()


def _outputs(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _outputs(v)]
    return [value]


def time_it(run: Any, host_inputs: list[Any], seconds: float) -> dict[str, Any]:
    """``run(device inputs) -> outputs`` timed as the farm times an engine: copies in, compute, copies out."""
    import torch

    stream = torch.cuda.current_stream()
    device_inputs = [h.to("cuda") for h in host_inputs]
    first = _outputs(run(device_inputs))
    host_outputs = [torch.empty(o.shape, dtype=o.dtype, pin_memory=True) for o in first]
    events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]

    def step() -> stats.Iteration:
        events[0].record(stream)
        for d, h in zip(device_inputs, host_inputs):
            d.copy_(h, non_blocking=True)
        events[1].record(stream)
        outs = _outputs(run(device_inputs))
        events[2].record(stream)
        for h, o in zip(host_outputs, outs):
            h.copy_(o, non_blocking=True)
        events[3].record(stream)
        events[3].synchronize()
        t = [0.0, *(events[0].elapsed_time(e) for e in events[1:])]
        return stats.Iteration(e2e=t[3], compute=t[2] - t[1], h2d=t[1], d2h=t[3] - t[2])

    m = stats.measure(step, warmup_ms=200, duration_s=seconds, min_iterations=10)
    summary = m.summary(1)
    return {
        "median_ms": summary["e2e"]["median"],
        "p99_ms": summary["e2e"]["p99"],
        "compute_median_ms": summary["compute"]["median"],
        "iterations": summary["iterations"],
        "outputs": [h.float().numpy() for h in host_outputs],
    }


def set_tf32(on: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def gate(run: Any, order: list[str], ref: check.Reference, fp16: bool) -> dict[str, Any]:
    """One way judged as the farm judges an artifact of its precision, on the reference's inputs."""
    import numpy as np
    import torch

    def outputs() -> list[dict[str, Any]]:
        got = []
        for feed in ref.feeds:
            devs = [torch.from_numpy(np.ascontiguousarray(feed[k])).to("cuda") for k in order]
            outs = [o.float().cpu().numpy() for o in _outputs(run(devs))]
            got.append(dict(zip(ref.names, outs)))
        return got

    precision = "fp16" if fp16 else "fp32"
    limits = DEFAULT_TOLERANCES[precision]
    result = check.judge(outputs(), ref, limits)
    if not result["pass"] and not fp16:  # the farm's TF32 rule: the same again with TF32 off
        set_tf32(False)
        try:
            exact = check.judge(outputs(), ref, limits)
        finally:
            set_tf32(True)
        if exact["pass"]:
            result = {**exact, "tf32_explains": True}
    broken = [f"{n}: {'; '.join(why)}" for n, why in (result.get("failures") or {}).items()]
    return {"precision": precision, "pass": bool(result["pass"]), "tf32": bool(result.get("tf32_explains")),
            "failures": broken[:3]}  # fmt: skip


def anchors(
    name: str, feeds: dict[str, Any], seconds: float, max_autotune: bool, ref: check.Reference | None = None
) -> list[dict[str, Any]]:
    import numpy as np
    import torch

    set_tf32(True)
    torch.backends.cudnn.benchmark = True
    model = build(name).cuda()
    conv = name in CONV_NETS
    # The forward's arguments in order (BERT's three; an image net's one, whatever its name).
    params = list(inspect.signature(model.forward).parameters)
    order = [p for p in params if p in feeds] if len(feeds) > 1 else list(feeds)
    host = [torch.from_numpy(np.ascontiguousarray(feeds[k])).pin_memory() for k in order]
    # fp32 first: channels-last, set for the fp16 ways of a convolutional net, stays on the module.
    ways: list[tuple[str, str | None, bool]] = [  # (the way, torch.compile's mode or None for eager, fp16)
        ("eager fp32", None, False),
        ("compile fp32", "default", False),
        ("compile fp32 reduce-overhead", "reduce-overhead", False),
        ("eager fp16", None, True),
        ("compile fp16", "default", True),
        ("compile fp16 reduce-overhead", "reduce-overhead", True),
    ]
    if max_autotune:
        ways.append(("compile fp16 max-autotune", "max-autotune", True))
    rows: list[dict[str, Any]] = []
    reference: list[Any] | None = None
    for way, mode, fp16 in ways:
        net = model.to(memory_format=torch.channels_last) if conv and fp16 else model
        if mode:
            torch._dynamo.reset()
        fn = torch.compile(net, mode=mode) if mode else net

        def run(inputs: list[Any], fn: Any = fn, fp16: bool = fp16, mode: str | None = mode) -> Any:
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16, enabled=fp16):
                if mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                return fn(*inputs)

        started = time.monotonic()
        row: dict[str, Any] = {"way": way, "batch": int(host[0].shape[0])}
        try:
            devs = [h.to("cuda") for h in host]
            run(devs)
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.monotonic() - started, 2)
            timed = time_it(run, host, seconds)
        except Exception as exc:  # noqa: BLE001 - one way that fails is a row that says why
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            continue
        outs = timed.pop("outputs")
        if reference is None:
            reference = outs
        row["max_abs_vs_eager_fp32"] = max(float(np.max(np.abs(a - b))) for a, b in zip(outs, reference))
        row.update(timed)
        if ref is not None:
            try:
                row["gate"] = gate(run, order, ref, fp16)
            except Exception as exc:  # noqa: BLE001 - a way that cannot be judged says why
                row["gate"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _farm(engines: dict[str, Any], precision: str) -> dict[str, Any]:
    """A CUDA artifact's sweep at the opt shape: the defaults' figure, the kept choice and its figure."""
    engine = next(
        (
            e
            for e in engines.values()
            if str(e.get("target", "")).startswith("onnxruntime/cuda-") and e.get("precision") == precision
        ),
        None,
    )
    if engine is None or not engine.get("sessions"):
        return {}
    by = {c["session"]: c for c in engine["sessions"]["choices"]}
    chosen = engine["sessions"]["chosen"]
    return {
        "default": (by.get("default") or {}).get("median_ms"),
        "chosen": chosen,
        "chosen_ms": (by.get(chosen) or {}).get("median_ms"),
        "pass": engine.get("accuracy_pass"),
        "sweep": (f"{engine['sessions']['seconds']} s: " if "seconds" in engine["sessions"] else "")
        + ", ".join(
            f"{k} {_ms(v.get('median_ms'))}" if "median_ms" in v else f"{k}: {v.get('error', '?')[:60]}"
            for k, v in by.items()
        ),  # fmt: skip
    }


WAYS = ("eager fp32", "eager fp16", "compile fp32", "compile fp32 reduce-overhead", "compile fp16",
        "compile fp16 reduce-overhead", "compile fp16 max-autotune")  # fmt: skip


def _way(row: dict[str, Any] | None) -> str:
    """A torch way's cell: its e2e p50, marked where it fails the gate its precision's artifact must pass."""
    if not row or "median_ms" not in row:
        return "-" if not row else "error"
    gated = row.get("gate") or {}
    mark = " (fails gate)" if gated.get("pass") is False else ""
    return f"{_ms(row['median_ms'])}{mark}"


def _best(rows: list[dict[str, Any]], passing: bool) -> float | None:
    times = [
        r["median_ms"]
        for r in rows
        if r["way"].startswith("compile") and "median_ms" in r and (not passing or (r.get("gate") or {}).get("pass"))
    ]
    return min(times) if times else None


def against_torch(results: dict[str, Any]) -> str:
    """The matrix's second table: per model, torch's ways and the farm's artifacts at the opt shape (e2e p50 ms)."""
    ways = [w for w in WAYS if any(
        r.get("way") == w for d in results.get("models", {}).values() if isinstance(d.get("torch"), list)
        for r in d["torch"])]  # fmt: skip
    lines = [
        "",
        "## Against torch on the same GPU (opt shape, e2e p50 ms: copies in, inference, copies out)",
        "",
        f"| model | batch | {' | '.join(ways)} | farm fp32 default → chosen | farm fp16 default → chosen "
        "| best farm / best compile | best farm / best compile that passes the gate | farm checks |",
        "|---|---|" + "---|" * len(ways) + "---|---|---|---|---|",
    ]
    sweeps = []
    for name, done in results.get("models", {}).items():
        rows = done.get("torch")
        if not isinstance(rows, list):
            continue
        by = {r["way"]: r for r in rows}
        engines = done.get("engines") or {}
        fp32, fp16 = _farm(engines, "fp32"), _farm(engines, "fp16")
        farm = [f["chosen_ms"] for f in (fp32, fp16) if f.get("chosen_ms") and f.get("pass")]
        ratios = []
        for passing in (False, True):
            best = _best(rows, passing)
            ratios.append(f"{min(farm) / best:.2f}x" if farm and best else "-")
        farms = [f"{_ms(f.get('default'))} → {_ms(f.get('chosen_ms'))} ({f.get('chosen', '-')})" if f else "-"
                 for f in (fp32, fp16)]  # fmt: skip
        pairs = (("fp32", fp32), ("fp16", fp16))
        checks = ", ".join(f"{p} {'pass' if f.get('pass') else 'FAIL'}" for p, f in pairs if f)
        batch = rows[0].get("batch") if rows else "-"
        cells = " | ".join(_way(by.get(w)) for w in ways)
        lines.append(f"| {name} | {batch} | {cells} | {' | '.join(farms)} | {' | '.join(ratios)} | {checks} |")
        sweeps += [f"- {name} {p}: {f['sweep']}" for p, f in (("fp32", fp32), ("fp16", fp16)) if f]
        compile_s = ", ".join(f"{r['way']} {r['first_call_s']} s" for r in rows if "first_call_s" in r)
        sweeps.append(f"- {name} torch first calls: {compile_s}")
        for r in rows:
            if (r.get("gate") or {}).get("pass") is False:
                sweeps.append(f"- {name} {r['way']} fails the {r['gate']['precision']} gate: "
                              f"{'; '.join(r['gate'].get('failures') or [])}")  # fmt: skip
    lines += ["", "Session sweeps (e2e p50 ms per choice), torch's first calls and gate failures:", "", *sweeps]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=["resnet50", "mobilenet-v2", "bert"])
    parser.add_argument("--samples", type=Path, required=True, help="the model's samples (.npz), as uploaded")
    parser.add_argument("--shapes", required=True, help="the opt shapes, JSON: {input: dims}")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--max-autotune", action="store_true")
    parser.add_argument("--reference", type=Path, help="the farm's reference file for the model: judge each way")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import numpy as np

    shapes = json.loads(args.shapes)
    with np.load(args.samples) as z:
        samples = {k: z[k] for k in z.files}
    feeds = {}
    for k, dims in shapes.items():
        have = samples[k]
        reps = -(-dims[0] // have.shape[0])
        feeds[k] = np.concatenate([have] * reps)[: dims[0]]
    ref = check.Reference.load(args.reference) if args.reference else None
    rows = anchors(args.name, feeds, args.seconds, args.max_autotune, ref)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
