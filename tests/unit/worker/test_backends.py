"""Build backends for real: TensorRT-RTX builds ahead of time without a GPU, ONNX Runtime on the CPU.

No TensorRT is mocked: every engine here comes out of the real builder and is checked by its bytes,
its descriptor and its log tail.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorrt_rtx as trt_rtx
from onnx import TensorProto, helper

from enginefarm.core.domain import Backend, Target
from enginefarm.core.errors import BackendMissing, BuildFailed, TargetUnavailable
from enginefarm.core.spec import BuildSpec
from enginefarm.graph.samples import conv_net, sample_spec, save_conv_net
from worker.backends import BuildLog, get_backend
from worker.pipeline import engine_from_model


def T(text: str) -> Target:
    return Target.parse(text)


def spec(**kwargs) -> BuildSpec:
    return BuildSpec(**{**sample_spec(), **kwargs})


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return save_conv_net(tmp_path_factory.mktemp("backend-models") / "convnet.onnx")


def build(model_path: Path, target: str, scratch: Path, log: BuildLog | None = None, **spec_kwargs):
    scratch.mkdir(parents=True, exist_ok=True)
    return engine_from_model(model_path, spec(**spec_kwargs), T(target), None, scratch, log or BuildLog())


# --------------------------------------------------------------------------- TensorRT-RTX


def test_rtx_sm86_engine_and_descriptor(model, tmp_path):
    log = BuildLog()
    built = build(model, "tensorrt-rtx/sm86", tmp_path, log)
    data = built.path.read_bytes()
    assert len(data) > 1000
    d = built.descriptor
    assert d.target == "tensorrt-rtx/sm86" and d.backend == Backend.TENSORRT_RTX.value
    assert d.compute_capability == "8.6" and d.compute_capabilities == ["8.6"]
    assert d.trt_version == trt_rtx.__version__ == d.backend_version
    assert d.platform == "x86_64"
    assert d.cuda_version and d.cuda_version.startswith("13")
    assert d.precision == "fp32" and d.gpu_name is None
    # the pipeline fills sha256 and size from the written file
    assert d.size == len(data) and d.sha256 == hashlib.sha256(data).hexdigest()
    assert built.seconds > 0
    tail = log.tail()
    assert "compute capability 8.6 (ahead of time" in tail
    assert "built tensorrt-rtx/sm86" in tail


def test_rtx_portable_engine(model, tmp_path):
    built = build(model, "tensorrt-rtx/portable", tmp_path)
    d = built.descriptor
    assert built.path.stat().st_size > 1000
    assert d.compute_capability is None
    assert {"8.6", "8.9", "12.0"} <= set(d.compute_capabilities)
    assert "7.5" not in d.compute_capabilities  # portable engines leave Turing out


def test_rtx_targets_give_different_engines(model, tmp_path):
    a = build(model, "tensorrt-rtx/sm80", tmp_path / "a")
    b = build(model, "tensorrt-rtx/sm89", tmp_path / "b")
    assert a.path.read_bytes() != b.path.read_bytes()
    assert a.descriptor.sha256 != b.descriptor.sha256
    assert (a.descriptor.compute_capability, b.descriptor.compute_capability) == ("8.0", "8.9")


def test_rtx_fp16_goes_through_the_strongly_typed_cast(model, tmp_path):
    log = BuildLog()
    fp32 = build(model, "tensorrt-rtx/sm86", tmp_path / "fp32")
    fp16 = build(model, "tensorrt-rtx/sm86", tmp_path / "fp16", log, precision="fp16")
    assert fp16.descriptor.precision == "fp16"
    assert fp16.path.stat().st_size > 1000
    assert fp16.path.read_bytes() != fp32.path.read_bytes()
    tail = log.tail()
    assert (
        re.search(r"fp16: \d+ of \d+ nodes in fp16", tail) and "converted by onnxruntime.transformers.float16" in tail
    )
    assert "strongly_typed=True" in tail
    # the cast model was written to the scratch dir and really holds float16 weights
    cast = onnx.load(str(tmp_path / "fp16" / "model.fp16.onnx"))
    assert {i.data_type for i in cast.graph.initializer} == {TensorProto.FLOAT16}
    assert cast.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT  # io types kept


def _custom_op_model(path: Path) -> Path:
    """A graph onnx.checker accepts (ops of unknown domains are not checked) but no parser knows."""
    graph = helper.make_graph(
        [helper.make_node("FancyOp", ["x"], ["y"], domain="com.example", name="fancy")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def test_rtx_parser_rejection_is_build_failed(tmp_path):
    bad = _custom_op_model(tmp_path / "custom.onnx")
    log = BuildLog()
    with pytest.raises(BuildFailed) as err:
        engine_from_model(bad, BuildSpec(), T("tensorrt-rtx/sm86"), None, tmp_path, log)
    msg = str(err.value)
    assert msg.startswith("this node's op is not a standard ONNX operator")
    assert "at node 'fancy' (FancyOp, inputs: x)" in msg and "Next step: replace the custom op" in msg
    assert "Plugin not found" in msg  # the parser's own words, last
    assert "[ERROR]" in log.tail()
    assert not (tmp_path / "engine.plan").exists()


def test_rtx_dynamic_model_without_profiles_fails(model, tmp_path):
    log = BuildLog()
    with pytest.raises(BuildFailed, match="an input has dynamic dims that no optimization profile covers"):
        engine_from_model(model, BuildSpec(), T("tensorrt-rtx/sm86"), None, tmp_path, log)
    assert "no optimization profile" in log.tail()
    assert not (tmp_path / "engine.plan").exists()


def test_rtx_static_model_needs_no_profile(tmp_path):
    static = save_conv_net(tmp_path / "static.onnx", dynamic_batch=False)
    built = engine_from_model(static, BuildSpec(), T("tensorrt-rtx/sm89"), None, tmp_path, BuildLog())
    assert built.descriptor.compute_capability == "8.9" and built.descriptor.size > 1000


def test_rtx_backend_version_is_the_module_version():
    assert get_backend(Backend.TENSORRT_RTX).version() == trt_rtx.__version__


# --------------------------------------------------------------------------- full TensorRT (absent here)


def test_tensorrt_backend_missing():
    backend = get_backend(Backend.TENSORRT)
    with pytest.raises(BackendMissing, match="the tensorrt module is not importable") as err:
        backend.version()
    assert isinstance(err.value, TargetUnavailable)  # the API maps it to 409, not a model error


def test_tensorrt_build_without_module_is_backend_missing(model, tmp_path):
    with pytest.raises(BackendMissing, match="not importable"):
        engine_from_model(model, spec(), T("tensorrt/sm86"), None, tmp_path, BuildLog())


# --------------------------------------------------------------------------- ONNX Runtime


def test_onnxruntime_build_matches_original(model, tmp_path):
    log = BuildLog()
    built = engine_from_model(model, spec(), T("onnxruntime/cpu-x86_64"), None, tmp_path, log)
    d = built.descriptor
    assert d.backend == "onnxruntime" and d.backend_version == ort.__version__
    assert d.platform == "x86_64" and d.compute_capability is None
    assert d.size == built.path.stat().st_size > 0
    assert "graph optimized for x86_64" in log.tail()

    optimized = onnx.load(str(built.path))  # a real ONNX file
    assert len(optimized.graph.node) > 0
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    got = ort.InferenceSession(str(built.path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert got.shape == want.shape == (2, 10)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_onnxruntime_other_cpu_is_unavailable(model, tmp_path):
    with pytest.raises(TargetUnavailable, match="this worker's CPU is x86_64"):
        engine_from_model(model, spec(), T("onnxruntime/cpu-aarch64"), None, tmp_path, BuildLog())
    assert not (tmp_path / "engine.plan").exists()


def test_onnxruntime_unloadable_model_is_build_failed(tmp_path):
    bad = _custom_op_model(tmp_path / "custom.onnx")
    with pytest.raises(BuildFailed, match="ONNX Runtime could not load the model"):
        engine_from_model(bad, BuildSpec(), T("onnxruntime/cpu-x86_64"), None, tmp_path, BuildLog())


# --------------------------------------------------------------------------- BuildLog


def test_build_log_keeps_only_the_last_lines():
    log = BuildLog(limit=3)
    for i in range(10):
        log.add(f"line {i}")
    assert list(log.lines) == ["line 7", "line 8", "line 9"]
    assert log.tail() == "line 7\nline 8\nline 9"


def test_build_log_limit_on_a_real_build(tmp_path):
    log = BuildLog(limit=5)
    build(save_conv_net(tmp_path / "m.onnx"), "tensorrt-rtx/sm120", tmp_path / "s", log)
    assert len(log.lines) == 5
    assert log.lines[-1].startswith("built tensorrt-rtx/sm120 in ")
    assert BuildLog().limit == 60


def test_conv_net_sample_is_valid():
    m = conv_net(channels=8, blocks=1)
    onnx.checker.check_model(m)
    assert [i.name for i in m.graph.input] == ["input"]
