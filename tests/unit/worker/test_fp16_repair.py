"""fp16 accuracy repair: the node whose activations leave fp16's range is ranked first and kept in fp32, the
repaired fp16 CPU artifact passes the gate it failed, the bisection of regions finds the same node on a larger
search, and the budget stop says so and recommends fp32."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from enginefarm.core.domain import Backend, Target
from enginefarm.core.probe.gpus import GpuInfo
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.spec import BuildSpec
from enginefarm.core.validation import validate_spec
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.measure.ort_runner import OrtRunner
from worker.backends import BuildLog, get_backend
from worker.fp16 import repair as F
from worker.fp16.stage import judge_target
from worker.measure.evaluate import check_accuracy

SHAPES = {"input": [1, 16]}


def overflow_model(path: Path, branches: int = 1, tag: str = "") -> Path:
    """``output = relu(x) + sum over branches of 1e-5 * mean(x * x)``, each branch's square read by two Concats
    before its mean. On samples of 300..400 the square (up to 160,000) leaves fp16's range (65,504): in fp16 the
    output is infinite. The means and the scaling back stay fp32 by the converter's own rules, and a Concat fed
    only by fp32 nodes stays fp32 too, so keeping a branch's ``square`` in fp32 mends that branch; keeping one
    Concat does not (the other still reads the square in fp16). ``tag`` names the graph: other bytes, so that a test
    does not find the engines of another's build of the same model in the catalog."""
    nodes, total = [], None
    for b in range(branches):
        s = "" if branches == 1 else f"_{b}"
        nodes += [
            helper.make_node("Mul", ["input", "input"], [f"sq{s}"], name=f"square{s}"),
            helper.make_node("Concat", [f"sq{s}"] * 2, [f"pair{s}"], name=f"pair{s}", axis=1),
            helper.make_node("Concat", [f"sq{s}"] * 3, [f"triple{s}"], name=f"triple{s}", axis=1),
            helper.make_node("ReduceMean", [f"pair{s}"], [f"m2{s}"], name=f"mean_pair{s}", axes=[1], keepdims=1),
            helper.make_node("ReduceMean", [f"triple{s}"], [f"m3{s}"], name=f"mean_triple{s}", axes=[1], keepdims=1),
            helper.make_node("Add", [f"m2{s}", f"m3{s}"], [f"m{s}"], name=f"means{s}"),
            helper.make_node("Mul", [f"m{s}", "small"], [f"branch{s}"], name=f"scale_back{s}"),
        ]
        if total is not None:
            nodes.append(helper.make_node("Add", [total, f"branch{s}"], [f"total{s}"], name=f"total{s}"))
        total = f"total{s}" if total is not None else f"branch{s}"
    nodes += [
        helper.make_node("Relu", ["input"], ["r"], name="relu"),
        helper.make_node("Add", ["r", total], ["output"], name="join"),
    ]
    return _saved(path, f"overflow{tag}", nodes, small=1e-5)


def hidden_overflow_model(path: Path) -> Path:
    """``output = relu(x) + 1e-3 * mean(x * x)``: the overflow model without its Concats. The square leaves fp16's
    range on the overflow samples, but nothing materializes it in fp16 on the CPU (the mean stays fp32 by the
    converter's rules, and ONNX Runtime's CPU runs the Mul in fp32 and drops the cast pair around it), so the CPU's
    fp16 artifact passes while a GPU's fp16 Mul overflows (tests/e2e/worker/test_fp16_repair_gpu.py)."""
    nodes = [
        helper.make_node("Mul", ["input", "input"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["m"], name="mean", axes=[1], keepdims=1),
        helper.make_node("Mul", ["m", "small"], ["branch"], name="scale_back"),
        helper.make_node("Relu", ["input"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "branch"], ["output"], name="join"),
    ]
    return _saved(path, "hidden_overflow", nodes, small=1e-3)


def _saved(path: Path, name: str, nodes: list, small: float) -> Path:
    """The graph of ``nodes`` from ``input`` to ``output`` (both [batch, 16] float), with the constant ``small``."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(np.array(small, np.float32), "small")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def overflow_samples(count: int = 8, seed: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).uniform(300, 400, (count, 16)).astype(np.float32)


def _runner(path: Path) -> OrtRunner:
    return OrtRunner(path, threads=1)


def _inputs(tmp_path: Path, branches: int = 1):
    source = overflow_model(tmp_path / f"overflow{branches}.onnx", branches)
    spec = BuildSpec(precision="fp16", shapes=SHAPES, accuracy_repair=True)
    return source, {"input": overflow_samples()}, spec, inspect_upload(source, tmp_path / "inspect").info


def _artifact_check(source: Path, samples, spec: BuildSpec, info, out: Path) -> dict:
    """The farm's fp16 CPU artifact of ``source`` under ``spec``, judged by the benchmark stage's accuracy check."""
    backend = get_backend(Backend.ONNXRUNTIME)
    out.parent.mkdir(parents=True, exist_ok=True)
    backend.build(source, spec, Target.parse(f"onnxruntime/cpu-{backend.host_platform()}"), out, BuildLog(), None)
    runner = _runner(out)
    try:
        return check_accuracy(runner, source, spec, info, samples)
    finally:
        runner.close()


def test_repair_keeps_exactly_the_overflowing_node_and_the_artifact_passes(tmp_path: Path):
    source, samples, spec, info = _inputs(tmp_path)
    # Without repair the fp16 artifact fails its accuracy check: the square is infinite in fp16.
    failed = _artifact_check(source, samples, spec, info, tmp_path / "plain" / "a.onnx")
    assert failed["pass"] is False and failed["worst"]["violations"] == 1.0, failed
    report = F.repair(source, source, samples, spec, info, tmp_path, _runner)
    assert report["precision"] == "fp16" and report["needed"] is True
    assert report["before"]["pass"] is False and report["before"].get("non_finite") is True
    assert report["passed"] is True and report["kept"] == ["square"], report
    assert report["after"]["pass"] is True and report["after"]["violations"] == 0.0
    first = report["ranking"][0]
    assert first["layers"] == ["square"] and first["ops"] == ["Mul"] and first["tensor"] == "sq"
    assert first["violations_fp16"] == 1.0 and first["violations_alone_float"] == 0.0 and first["pass_alone"]
    # No other node alone mends it: a Concat kept in fp32 leaves the other reading the square in fp16.
    assert all(not r["pass_alone"] for r in report["ranking"][1:]) and len(report["ranking"]) == 5
    assert {n for r in report["ranking"] for n in r["layers"]} == {"square", "pair", "triple", "relu", "join"}
    assert report["candidates"] == 5 and report["budget"] == 1
    assert report["evaluations"] == 1 + 5  # before, then each candidate once (the search reuses the figures)
    assert 0 < report["check_seconds"] < report["seconds"] and report["cost_in_checks"] > 1
    assert "CPU" in report["measured_on"] and list(tmp_path.glob("fp16-repair-*")) == []
    # The kept set, given to the build, makes the artifact pass the same check.
    repaired = spec.model_copy(update={"keep_fp32_layers": report["kept"]})
    passed = _artifact_check(source, samples, repaired, info, tmp_path / "repaired" / "a.onnx")
    assert passed["pass"] is True, passed
    again = F.repair(source, source, samples, spec, info, tmp_path, _runner)  # the same inputs, the same answer
    assert again["kept"] == report["kept"] and again["ranking"] == report["ranking"]


def test_regions_are_bisected_down_to_the_node_above_the_node_limit(tmp_path: Path, monkeypatch):
    source, samples, spec, info = _inputs(tmp_path)
    monkeypatch.setattr(F, "NODE_LIMIT", 2)
    monkeypatch.setattr(F, "REGIONS", 2)
    report = F.repair(source, source, samples, spec, info, tmp_path, _runner)
    assert report["passed"] is True and report["kept"] == ["square"], report
    assert report["method"].startswith("2 regions of the nodes converted to fp16")
    # The region holding the square, then its halves, down to the square alone, ranked first of the single nodes.
    sizes = [len(r["layers"]) for r in report["ranking"]]
    assert max(sizes) > 1 and ["square"] in [r["layers"] for r in report["ranking"]]
    assert report["ranking"][0]["pass_alone"] and "square" in report["ranking"][0]["layers"]


def test_repair_is_not_needed_when_fp16_passes(tmp_path: Path):
    source, _, spec, info = _inputs(tmp_path)
    small = {"input": np.random.default_rng(1).uniform(0, 2, (4, 16)).astype(np.float32)}  # squares fit fp16
    report = F.repair(source, source, small, spec, info, tmp_path, _runner)
    assert report["needed"] is False and report["passed"] is True and report["kept"] == []
    assert report["evaluations"] == 1 and "ranking" not in report


def test_repair_stops_honestly_when_no_set_within_the_budget_passes(tmp_path: Path):
    source, samples, spec, info = _inputs(tmp_path, branches=3)  # three squares overflow; the budget is two nodes
    report = F.repair(source, source, samples, spec, info, tmp_path, _runner)
    assert report["candidates"] == 11 and report["budget"] == 2
    assert report["needed"] is True and report["passed"] is False and report["kept"] == [], report
    assert report["after"]["pass"] is False
    assert report["note"].startswith("no set of up to 2 of the 11 nodes converted to fp16, kept in fp32, passes")
    assert report["note"].endswith("build fp32 for this model")


def test_accuracy_repair_is_accepted_for_fp16_and_int8_and_refused_otherwise(tmp_path: Path):
    info = inspect_upload(overflow_model(tmp_path / "m.onnx"), tmp_path / "inspect").info
    cpu = [Target.parse("onnxruntime/cpu-x86_64")]

    def problems(precision: str, model=info) -> list[dict]:
        spec = BuildSpec(precision=precision, shapes=SHAPES, accuracy_repair=True)
        return [p for p in validate_spec(spec, model, cpu, has_samples=True) if "accuracy_repair" in p["loc"]]

    assert problems("fp16") == [] and problems("int8") == []
    for precision in ("fp32", "bf16"):
        (refused,) = problems(precision)
        assert refused["msg"].endswith(f"not to {precision}"), refused
    # A model that holds Q/DQ already is built as it is: nothing of it is the farm's to repair.
    (refused,) = problems("fp16", replace(info, has_qdq=True))
    assert refused["msg"].endswith("not to a model that holds Q/DQ already"), refused


def test_the_cpu_does_not_see_an_overflow_that_no_fp16_tensor_materializes(tmp_path: Path):
    """The case for judging on the GPU: on the CPU this fp16 model needs no repair; the GPU test shows it does."""
    source = hidden_overflow_model(tmp_path / "hidden.onnx")
    spec = BuildSpec(precision="fp16", shapes=SHAPES, accuracy_repair=True)
    info = inspect_upload(source, tmp_path / "inspect").info
    report = F.repair(source, source, {"input": overflow_samples()}, spec, info, tmp_path, _runner)
    assert report["needed"] is False and report["before"]["max_abs"] == 0.0, report
    assert report["judged_on"] == f"onnxruntime/cpu-{get_backend(Backend.ONNXRUNTIME).host_platform()}"


def _probe(gpus, ort_cuda: str | None) -> MachineProbe:
    probe = MachineProbe(
        hostname="node1",
        platform="x86_64",
        os="Linux",
        gpus=list(gpus),
        driver_version="580.82.07" if gpus else None,
        cuda_version="13.0" if gpus else None,
        jetson=None,
        modules={"tensorrt": None, "tensorrt_rtx": None, "onnxruntime": "1.31.1"},
        module_errors={},
    )
    probe.ort_cuda = ort_cuda
    return probe


def test_the_fp16_repair_is_judged_on_the_gpu_of_a_cuda_target_this_worker_runs():
    h100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "9.0", 81559, "GPU-0")
    cpu, sm90, sm86 = (
        Target.parse(t) for t in ("onnxruntime/cpu-x86_64", "onnxruntime/cuda-sm90", "onnxruntime/cuda-sm86")
    )
    rtx = Target.parse("tensorrt-rtx/sm86")
    gpu_worker = _probe([h100], "13.0")
    assert judge_target([cpu, rtx, sm90], gpu_worker) == sm90
    assert judge_target([cpu, rtx], gpu_worker) is None  # no ONNX Runtime CUDA target: the CPU judges
    assert judge_target([cpu, sm86], gpu_worker) is None  # a GPU of another compute capability cannot judge sm86
    assert judge_target([cpu, sm90], _probe([h100], None)) is None  # onnxruntime without its CUDA provider
    assert judge_target([cpu, sm90], _probe([], None)) is None  # a CPU worker
