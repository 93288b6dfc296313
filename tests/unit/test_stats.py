"""Statistics, the measurement loop, inputs and the accuracy gate of the benchmark stage, on known values."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from enginefarm.core.domain import ModelInfo, Target, TensorInfo
from enginefarm.core.probe.gpus import GpuInfo
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.probe.policy import benchmark_pending_reason, benchmark_targets
from enginefarm.core.spec import AccuracySpec, BenchmarkSpec, BuildSpec
from enginefarm.core.stats import Iteration, measure, median, percentile, summarize
from enginefarm.graph.inputs import (
    SamplesInvalid,
    benchmark_shape_problems,
    load_samples,
    sample_batches,
    shape_sets,
)
from enginefarm.measure import accuracy
from enginefarm.measure.inputs import random_inputs

# ------------------------------------------------------------------ statistics (trtexec's definitions)


def test_summary_of_one_to_hundred():
    s = summarize([float(v) for v in range(100, 0, -1)])  # unsorted on purpose
    assert (s.count, s.min, s.max, s.mean) == (100, 1.0, 100.0, 50.5)
    assert s.median == 50.5  # even count: the mean of the two middle samples
    # trtexec: index max(n - 1 - int((1 - p/100) * n), 0) of the sorted samples.
    assert (s.p90, s.p95, s.p99) == (90.0, 95.0, 99.0)
    assert s.stdev == pytest.approx(math.sqrt((100**2 - 1) / 12))


@pytest.mark.parametrize(
    "samples, p, expected",
    [
        ([5.0], 99, 5.0),  # one sample is every percentile
        ([1.0, 2.0], 50, 1.0),  # exclude int(0.5 * 2) = 1 → index 0
        ([1.0, 2.0], 99, 2.0),  # exclude int(0.01 * 2) = 0 → the max
        ([1.0, 2.0, 3.0], 90, 3.0),  # exclude int(0.1 * 3) = 0
        (list(range(1, 11)), 90, 9.0),  # exclude int(0.1 * 10) = 1 → index 8
        (list(range(1, 1001)), 99.9, 999.0),  # exclude 1 of 1000, computed exactly
        (list(range(1, 11)), 95, 10.0),  # exclude int(0.05 * 10) = 0
        (list(range(1, 11)), 0, 1.0),  # exclude all: clamped to index 0
        (list(range(1, 11)), 100, 10.0),
    ],
)
def test_percentile_edges(samples, p, expected):
    assert percentile(sorted(samples), p) == expected


def test_median_odd_and_even():
    assert median([1.0, 3.0, 7.0]) == 3.0
    assert median([1.0, 3.0, 7.0, 9.0]) == 5.0


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="no samples"):
        summarize([])
    with pytest.raises(ValueError, match="finite"):
        summarize([1.0, float("nan")])
    with pytest.raises(ValueError, match="not in"):
        percentile([1.0], 101)


class FakeClock:
    """A clock counted in whole microseconds, so the loop's arithmetic is exact."""

    def __init__(self) -> None:
        self.us = 0

    def __call__(self) -> float:
        return self.us / 1e6


def _stepper(clock: FakeClock, ms: int):
    calls = []

    def step() -> Iteration:
        clock.us += ms * 1000
        calls.append(clock.us)
        return Iteration(e2e=ms, compute=ms / 2, h2d=ms / 4, d2h=ms / 4)

    return step, calls


def test_measure_follows_trtexec_defaults():
    clock = FakeClock()
    step, calls = _stepper(clock, 10)  # 10 ms per inference
    m = measure(step, clock=clock)
    assert m.warmup_iterations == 20 and m.warmup_s == pytest.approx(0.2)
    assert len(m.iterations) == 300 and m.wall_s == pytest.approx(3.0)  # duration, not count, decides
    out = m.summary(batch=4)
    assert out["throughput_qps"] == pytest.approx(100.0) and out["throughput_items_s"] == pytest.approx(400.0)
    assert out["compute"]["median"] == 5.0 and out["h2d"]["p99"] == 2.5 and out["e2e"]["count"] == 300


def test_measure_runs_the_minimum_iterations_when_each_is_slow():
    clock = FakeClock()
    step, _ = _stepper(clock, 1000)  # one second each: 3 s would need only 3
    m = measure(step, warmup_ms=0, duration_s=3.0, min_iterations=10, clock=clock)
    assert m.warmup_iterations == 1 and len(m.iterations) == 10 and m.wall_s == pytest.approx(10.0)


def test_measure_without_copies_reports_none_for_them():
    clock = FakeClock()

    def step() -> Iteration:
        clock.us += 1000
        return Iteration(e2e=1.0, compute=1.0)

    out = measure(step, warmup_ms=0, duration_s=0.0, min_iterations=3, clock=clock).summary()
    assert out["h2d"] is None and out["d2h"] is None and out["e2e"]["count"] == 3


# ------------------------------------------------------------------ inputs

INFO = ModelInfo(
    inputs=[TensorInfo("input", "FLOAT", ["batch", 3, 8, 8]), TensorInfo("ids", "INT64", ["batch", 4])],
    outputs=[TensorInfo("y", "FLOAT", ["batch", 2])],
    opset=17,
    ir_version=8,
    producer="t",
    size=1,
)
PROFILE = {
    "profiles": [
        {
            "input": {"min": [1, 3, 8, 8], "opt": [4, 3, 8, 8], "max": [8, 3, 8, 8]},
            "ids": {"min": [1, 4], "opt": [4, 4], "max": [8, 4]},
        }
    ]
}


def test_shape_sets_opt_batches_and_explicit():
    assert [(s.key, s.batch) for s in shape_sets(BuildSpec(**PROFILE), INFO)] == [("opt", 4)]
    sets = shape_sets(BuildSpec(**PROFILE, benchmark={"batch_sizes": [1, 8]}), INFO)
    assert [(s.key, s.shapes["input"], s.shapes["ids"]) for s in sets] == [
        ("batch=1", [1, 3, 8, 8], [1, 4]),
        ("batch=8", [8, 3, 8, 8], [8, 4]),
    ]
    (one,) = shape_sets(BuildSpec(**PROFILE, benchmark={"shapes": [{"input": [2, 3, 8, 8], "ids": [2, 4]}]}), INFO)
    assert one.key == "ids=2x4,input=2x3x8x8" and one.batch == 2


def test_benchmark_shapes_outside_the_profile_are_problems():
    spec = BuildSpec(**PROFILE, benchmark={"batch_sizes": [16]})
    assert "outside the profile's batch range 1..8" in benchmark_shape_problems(spec, INFO)[0]["msg"]
    spec = BuildSpec(**PROFILE, benchmark={"shapes": [{"input": [2, 3, 9, 8], "nope": [1]}]})
    msgs = " | ".join(p["msg"] for p in benchmark_shape_problems(spec, INFO))
    assert "outside the profile" in msgs and "unknown input 'nope'" in msgs
    with pytest.raises(ValueError, match="either 'shapes' or 'batch_sizes'"):
        BenchmarkSpec(shapes=[{"input": [1, 3, 8, 8]}], batch_sizes=[1])


def test_random_inputs_are_seeded_and_typed():
    a = random_inputs(INFO, {"input": [2, 3, 8, 8], "ids": [2, 4]}, seed=7)
    b = random_inputs(INFO, {"input": [2, 3, 8, 8], "ids": [2, 4]}, seed=7)
    c = random_inputs(INFO, {"input": [2, 3, 8, 8], "ids": [2, 4]}, seed=8)
    assert a["input"].dtype == np.float32 and a["ids"].dtype == np.int64 and a["ids"].min() >= 0
    assert np.array_equal(a["input"], b["input"]) and not np.array_equal(a["input"], c["input"])


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_samples_checked_against_the_model():
    good = load_samples(_npz(input=np.zeros((6, 3, 8, 8), np.float64), ids=np.ones((6, 4), np.int32)), INFO)
    assert good["input"].dtype == np.float32 and good["ids"].dtype == np.int64
    batches = sample_batches(good, INFO, 4)
    assert [b["input"].shape[0] for b in batches] == [4]  # the remainder is dropped
    with pytest.raises(SamplesInvalid) as bad:
        load_samples(_npz(input=np.zeros((2, 3, 9, 8), np.float32), extra=np.zeros(1)), INFO)
    text = str(bad.value)
    assert "axis 2 is fixed at 8" in text and "'extra' is not a model input" in text and "'ids' has no array" in text
    with pytest.raises(SamplesInvalid, match="different numbers of samples"):
        load_samples(_npz(input=np.zeros((2, 3, 8, 8), np.float32), ids=np.zeros((3, 4), np.int64)), INFO)
    with pytest.raises(SamplesInvalid, match="plain arrays"):
        load_samples(_npz(input=np.array([object()] * 2)), INFO)
    with pytest.raises(SamplesInvalid, match=r"\.npz"):
        load_samples(b"garbage", INFO)


# ------------------------------------------------------------------ accuracy


def test_metrics_on_known_values():
    ref = np.array([3.0, 4.0], np.float32)
    m = accuracy.metrics(ref, np.array([3.0, 4.5], np.float32))
    assert m["max_abs"] == 0.5 and m["mean_abs"] == 0.25 and m["rel_l2"] == pytest.approx(0.1)
    assert m["cosine"] == pytest.approx((9 + 18) / (5 * math.hypot(3, 4.5)))
    assert accuracy.metrics(np.zeros(3), np.zeros(3))["cosine"] == 1.0
    nan = accuracy.metrics(ref, np.array([np.nan, 1.0]))
    assert nan["non_finite"] and accuracy.failures(nan, {"cosine": 0.9})
    assert accuracy.failures(nan, {"violations": 0.0})
    with pytest.raises(ValueError, match="shapes differ"):
        accuracy.metrics(ref, np.zeros(3))


def test_judge_against_precision_tolerances():
    limits = AccuracySpec().limits("fp16")
    assert limits["atol"] == 1e-2 and limits["rtol"] == 1e-2
    ref = np.linspace(-5, 5, 1000).astype(np.float32)
    close = accuracy.metrics(ref, ref + 0.005, limits["atol"], limits["rtol"])
    ok = accuracy.judge({"y": close}, limits)
    assert ok["pass"] is True and ok["failures"] == {} and close["violations"] == 0
    far = ref.copy()
    far[:10] += 1.0  # 1% of the elements off by far more than atol + rtol*|ref|
    bad = accuracy.judge({"y": accuracy.metrics(ref, far, limits["atol"], limits["rtol"])}, limits)
    assert bad["pass"] is False and "1% of elements outside atol 0.01" in bad["failures"]["y"][0]
    # A share too small for three decimals still reads.
    tiny = accuracy.failures({"violations": 4 / 1_230_000}, {**AccuracySpec().limits("fp32"), "violations": 0.0})
    assert tiny == ["0.000325% of elements outside atol 0.0001 + rtol 0.001*|ref| (allowed: 0%)"], tiny
    override = AccuracySpec(tolerances={"violations": 0.05}).limits("fp16")
    assert accuracy.judge({"y": accuracy.metrics(ref, far, 1e-2, 1e-2)}, override)["pass"] is True
    assert accuracy.merge([{"cosine": 0.99, "max_abs": 1.0}, {"cosine": 0.98, "max_abs": 0.5}]) == {
        "cosine": 0.98,
        "max_abs": 1.0,
    }
    with pytest.raises(ValueError, match="unknown tolerance"):
        AccuracySpec(tolerances={"psnr": 30})
    with pytest.raises(ValueError, match=">= 0"):
        AccuracySpec(tolerances={"atol": -1})


def test_fp32_gate_passes_near_zero_outputs_that_match_to_1e9():
    """A probability map that is mostly ~0 (a text detector's output): an fp32 artifact matching to 1e-9 used to
    fail on relative L2 and cosine; the elementwise gate passes it and still reports both figures."""
    rng = np.random.default_rng(0)
    ref = (rng.random(10_000) * 1e-6).astype(np.float32)
    ref[:5] = 0.5
    got = ref + rng.normal(0, 1e-9, ref.shape).astype(np.float32)
    limits = AccuracySpec().limits("fp32")
    m = accuracy.metrics(ref, got, limits["atol"], limits["rtol"])
    result = accuracy.judge({"maps": m}, limits)
    assert result["pass"] is True, result["failures"]
    assert m["violations"] == 0 and "rel_l2" in m and "cosine" in m
    wrong = got.copy()
    wrong[100] = 0.01  # one element off by 1e-2 fails fp32
    assert accuracy.judge({"maps": accuracy.metrics(ref, wrong, 1e-4, 1e-3)}, limits)["pass"] is False


def test_integer_outputs_are_judged_by_agreement():
    ref = np.arange(100, dtype=np.int64) % 7
    same = accuracy.metrics(ref, ref.astype(np.int32))
    assert same == {"agreement": 1.0, "max_abs": 0.0}
    flipped = ref.copy()
    flipped[:3] += 1
    m = accuracy.metrics(ref, flipped)
    assert m["agreement"] == pytest.approx(0.97)
    assert accuracy.judge({"cls": m}, AccuracySpec().limits("fp32"))["pass"] is False  # fp32: exact
    assert accuracy.judge({"cls": m}, AccuracySpec().limits("int8"))["pass"] is True  # int8: 90% agreement
    masks = accuracy.metrics(np.array([True, False, True]), np.array([True, True, True]))
    assert masks["agreement"] == pytest.approx(2 / 3)


def test_check_settings_do_not_change_the_engine_hash():
    a, b = BuildSpec(**PROFILE), BuildSpec(**PROFILE, benchmark={"duration_s": 10}, accuracy={"seed": 3})
    assert a.spec_hash() == b.spec_hash() and a.checks_hash() != b.checks_hash()
    assert BuildSpec(**b.stored()).benchmark.duration_s == 10


# ------------------------------------------------------------------ which engines a worker can benchmark


def _probe(ccs: list[str], modules: dict) -> MachineProbe:
    gpus = [GpuInfo(i, f"GPU {cc}", cc, 24000) for i, cc in enumerate(ccs)]
    return MachineProbe("h", "x86_64", "linux", gpus, "580.65", "13.0", None, modules)


def test_benchmark_targets_follow_the_gpu_and_runtimes():
    rtx = {"tensorrt_rtx": "1.7.1.116", "onnxruntime": "1.22.0"}
    assert [str(t) for t in benchmark_targets(_probe(["8.6"], rtx))] == [
        "onnxruntime/cpu-x86_64",
        "tensorrt-rtx/portable",
        "tensorrt-rtx/sm86",
    ]
    # Hopper: TensorRT-RTX does not run there, full TensorRT does.
    assert [str(t) for t in benchmark_targets(_probe(["9.0"], rtx))] == ["onnxruntime/cpu-x86_64"]
    assert [str(t) for t in benchmark_targets(_probe(["9.0"], {"tensorrt": "10.13.3.9"}))] == ["tensorrt/sm90"]
    assert benchmark_targets(_probe([], rtx)) == [Target.parse("onnxruntime/cpu-x86_64")]  # no GPU: CPU only
    assert (
        benchmark_pending_reason(Target.parse("tensorrt-rtx/sm86"))
        == "benchmark pending: no worker with an sm86 GPU and tensorrt_rtx"
    )


def test_the_fp32_gate_passes_rounding_near_exact_zeros_and_fails_a_wrong_artifact():
    """A depth network's outputs are about 30 with exact zeros; its optimized fp32 graph put 4 of 1.23 million
    elements 2.4e-4 off, all near zero (max abs 2.4e-4): a correct artifact, and it passes. One that is wrong in a
    few hundred places, or an fp16 one that overflows, still fails."""
    rng = np.random.default_rng(7)
    ref = (30 + rng.standard_normal(1_230_000)).astype(np.float32)
    ref[::1000] = 0.0  # exact zeros, where rtol*|ref| allows nothing
    rounded = ref.copy()
    rounded[[0, 1000, 2000, 3000]] = 2.4e-4
    fp32 = AccuracySpec().limits("fp32")
    near = accuracy.metrics(ref, rounded, fp32["atol"], fp32["rtol"])
    assert near["violations"] == pytest.approx(4 / 1_230_000) and near["max_abs"] == pytest.approx(2.4e-4)
    assert accuracy.judge({"depth": near}, fp32)["pass"] is True
    wrong = ref.copy()
    wrong[:300] += 0.5  # 300 elements (0.024%) off by 0.5
    bad = accuracy.judge({"depth": accuracy.metrics(ref, wrong, fp32["atol"], fp32["rtol"])}, fp32)
    assert bad["pass"] is False and bad["failures"]["depth"][0].startswith("0.0244% of elements outside"), bad
    overflow = ref.copy()
    overflow[5] = np.inf
    fp16 = AccuracySpec().limits("fp16")
    assert accuracy.judge({"depth": accuracy.metrics(ref, overflow, fp16["atol"], fp16["rtol"])}, fp16)["pass"] is False
