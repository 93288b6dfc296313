"""Domain types: targets, build specs and their hash, spec validation, trtexec shape syntax."""

from __future__ import annotations

import json

import pydantic
import pytest

from enginefarm.core.domain import ARCHES, Backend, ModelInfo, Target, TensorInfo, all_targets, arch_of_cc, cc_of_arch
from enginefarm.core.names import check_model_name, project_problem
from enginefarm.core.shapes import parse_trtexec_shapes, spec_shapes_from_trtexec
from enginefarm.core.spec import MAX_PROFILES, BuildSpec, Precision
from enginefarm.core.validation import parse_targets, target_precision, validate_spec


def T(text: str) -> Target:
    return Target.parse(text)


def msgs(problems: list[dict]) -> str:
    return "\n".join(p["msg"] for p in problems)


def info(*inputs: TensorInfo, has_qdq: bool = False) -> ModelInfo:
    return ModelInfo(
        inputs=list(inputs),
        outputs=[TensorInfo("logits", "float", ["batch", 10])],
        opset=17,
        ir_version=8,
        producer="test",
        size=1000,
        has_qdq=has_qdq,
    )


IMAGE = TensorInfo("input", "float", ["batch", 3, 32, 32])
STATIC = TensorInfo("input", "float", [1, 3, 32, 32])


# --------------------------------------------------------------------------- targets


@pytest.mark.parametrize(
    "text, backend, arch, cc",
    [
        ("tensorrt-rtx/sm86", Backend.TENSORRT_RTX, "sm86", "8.6"),
        ("tensorrt/sm120", Backend.TENSORRT, "sm120", "12.0"),
        ("tensorrt-rtx/portable", Backend.TENSORRT_RTX, "portable", None),
        ("onnxruntime/cpu-x86_64", Backend.ONNXRUNTIME, "cpu-x86_64", None),
        ("  tensorrt/sm87 ", Backend.TENSORRT, "sm87", "8.7"),
    ],
)
def test_target_parse_good(text, backend, arch, cc):
    t = T(text)
    assert (t.backend, t.arch, t.compute_capability) == (backend, arch, cc)
    assert str(t) == text.strip()
    assert T(str(t)) == t
    assert t.is_gpu is (backend is not Backend.ONNXRUNTIME)


@pytest.mark.parametrize(
    "text, words",
    [
        ("tensorrt-llm/sm86", ["unknown backend 'tensorrt-llm'", "known: tensorrt, tensorrt-rtx, onnxruntime"]),
        ("tensorrt-rtx/sm90", ["tensorrt-rtx cannot build for 'sm90'", "portable"]),
        ("tensorrt/portable", ["tensorrt cannot build for 'portable'"]),
        ("onnxruntime/cpu-riscv64", ["onnxruntime cannot build for 'cpu-riscv64'", "cpu-x86_64, cpu-aarch64"]),
        ("tensorrt-rtx", ["must be written BACKEND/ARCH", "for example tensorrt-rtx/sm86"]),
        ("tensorrt-rtx/", ["must be written BACKEND/ARCH"]),
        ("", ["must be written BACKEND/ARCH"]),
    ],
)
def test_target_parse_bad(text, words):
    with pytest.raises(ValueError) as err:
        T(text)
    for word in words:
        assert word in str(err.value)


def test_target_queue():
    assert T("tensorrt-rtx/sm86").queue == "build.tensorrt-rtx.sm86"
    assert T("onnxruntime/cpu-aarch64").queue == "build.onnxruntime.cpu-aarch64"
    assert len({t.queue for t in all_targets()}) == len(all_targets()) == sum(len(a) for a in ARCHES.values())


def test_onnxruntime_cuda_targets():
    t = T("onnxruntime/cuda-sm90")
    assert (t.compute_capability, t.is_gpu, t.is_ort_cuda) == ("9.0", True, True)
    assert (t.queue, t.bench_queue) == ("build.onnxruntime.cuda-sm90", "bench.onnxruntime.cuda-sm90")
    cpu = T("onnxruntime/cpu-x86_64")
    assert (cpu.compute_capability, cpu.is_gpu, cpu.is_ort_cuda) == (None, False, False)
    with pytest.raises(ValueError, match="onnxruntime cannot build for 'cuda-sm61'"):
        T("onnxruntime/cuda-sm61")


def test_parse_targets_collects_every_problem():
    targets, problems = parse_targets(["tensorrt-rtx/sm86", "nope/sm86", "tensorrt/sm61"])
    assert targets == [T("tensorrt-rtx/sm86")]
    assert [p["loc"] for p in problems] == [["targets", 1], ["targets", 2]]
    assert "unknown backend 'nope'" in problems[0]["msg"] and "cannot build for 'sm61'" in problems[1]["msg"]
    assert "at least one target" in msgs(parse_targets([])[1])


@pytest.mark.parametrize(
    "arch, cc",
    [
        ("sm75", "7.5"),
        ("sm86", "8.6"),
        ("sm87", "8.7"),
        ("sm90", "9.0"),
        ("sm100", "10.0"),
        ("sm120", "12.0"),
        ("sm121", "12.1"),
    ],
)
def test_cc_of_arch_and_back(arch, cc):
    assert cc_of_arch(arch) == cc
    assert arch_of_cc(cc) == arch


@pytest.mark.parametrize("arch", ["portable", "cpu-x86_64", "cpu-aarch64", "sm", "smXY"])
def test_cc_of_non_gpu_arch_is_none(arch):
    assert cc_of_arch(arch) is None


def test_arch_of_cc_without_minor():
    assert arch_of_cc("9") == "sm90"


# --------------------------------------------------------------------------- build spec and its hash


def test_spec_hash_static_shapes_equal_single_profile():
    static = BuildSpec(shapes={"input": [1, 3, 32, 32]})
    profile = BuildSpec(profiles=[{"input": {"min": [1, 3, 32, 32], "opt": [1, 3, 32, 32], "max": [1, 3, 32, 32]}}])
    assert static.spec_hash() == profile.spec_hash()
    assert len(static.spec_hash()) == 64
    assert static.normalized_profiles() == profile.normalized_profiles()


def test_spec_hash_changes_with_precision_and_shapes():
    base = BuildSpec(shapes={"input": [1, 3, 32, 32]})
    assert base.spec_hash() != BuildSpec(shapes={"input": [1, 3, 32, 32]}, precision="fp16").spec_hash()
    assert base.spec_hash() != BuildSpec(shapes={"input": [2, 3, 32, 32]}).spec_hash()
    assert base.spec_hash() != BuildSpec(shapes={"input": [1, 3, 32, 32]}, version_compatible=True).spec_hash()


def test_spec_hash_fills_defaults():
    assert BuildSpec().spec_hash() == BuildSpec(precision="fp32", optimization_level=3, timing_cache=True).spec_hash()


def test_spec_hash_independent_of_key_order():
    a = BuildSpec.model_validate(
        {"precision": "fp16", "shapes": {"a": [1, 2], "b": [3, 4]}, "optimization_level": 4, "workspace_mib": 512}
    )
    b = BuildSpec.model_validate(
        {"workspace_mib": 512, "optimization_level": 4, "shapes": {"b": [3, 4], "a": [1, 2]}, "precision": "fp16"}
    )
    assert a.spec_hash() == b.spec_hash()
    p1 = BuildSpec(profiles=[{"x": {"min": [1], "opt": [2], "max": [4]}, "y": {"max": [8], "min": [1], "opt": [4]}}])
    p2 = BuildSpec(profiles=[{"y": {"opt": [4], "min": [1], "max": [8]}, "x": {"min": [1], "max": [4], "opt": [2]}}])
    assert p1.spec_hash() == p2.spec_hash()


def test_spec_rejects_unknown_fields():
    with pytest.raises(pydantic.ValidationError, match="fp16_mode"):
        BuildSpec.model_validate({"fp16_mode": True})
    with pytest.raises(pydantic.ValidationError):
        BuildSpec.model_validate({"profiles": [{"input": {"min": [1], "opt": [1], "max": [1], "best": [1]}}]})


def test_spec_rejects_input_in_shapes_and_profiles():
    with pytest.raises(pydantic.ValidationError, match="also given in 'shapes'; give each input once"):
        BuildSpec(
            shapes={"input": [1, 3, 32, 32]},
            profiles=[{"input": {"min": [1, 3, 32, 32], "opt": [1, 3, 32, 32], "max": [1, 3, 32, 32]}}],
        )


def test_spec_field_bounds():
    with pytest.raises(pydantic.ValidationError):
        BuildSpec(optimization_level=6)
    with pytest.raises(pydantic.ValidationError):
        BuildSpec(workspace_mib=0)
    with pytest.raises(pydantic.ValidationError):
        BuildSpec(precision="fp4")


def test_normalized_profiles_fold_static_shapes_into_each_profile():
    s = BuildSpec(
        shapes={"mask": [1, 128]},
        profiles=[
            {"input": {"min": [1, 3], "opt": [2, 3], "max": [4, 3]}},
            {"input": {"min": [8, 3], "opt": [8, 3], "max": [16, 3]}},
        ],
    )
    profiles = s.normalized_profiles()
    assert len(profiles) == 2
    assert all(p["mask"].min == p["mask"].max == [1, 128] for p in profiles)
    assert profiles[1]["input"].max == [16, 3]


# --------------------------------------------------------------------------- validation


def test_validate_good_spec_has_no_problems():
    assert (
        validate_spec(
            BuildSpec(
                **{"profiles": [{"input": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}}]}
            ),
            info(IMAGE),
            [T("tensorrt-rtx/sm86"), T("onnxruntime/cpu-x86_64")],
        )
        == []
    )


def test_validate_reports_every_problem_at_once():
    mask = TensorInfo("mask", "int64", ["batch", 128])
    extra = TensorInfo("extra", "float", ["batch", "seq"])
    s = BuildSpec(
        shapes={"mask": [1, 128, 1]},  # wrong rank
        profiles=[
            {
                "input": {"min": [4, 3, 32, 32], "opt": [1, 3, 32, 32], "max": [8, 3, 32, 32]},  # min > opt
                "ghost": {"min": [1], "opt": [1], "max": [1]},  # unknown input
            }
        ],
    )  # "extra" is dynamic and given nothing
    problems = validate_spec(s, info(IMAGE, mask, extra), [T("tensorrt-rtx/sm86")])
    text = msgs(problems)
    assert "unknown input 'ghost' (model inputs: input, mask, extra)" in text
    assert "input 'mask' has rank 2, min shape [1, 128, 1] has rank 3" in text
    assert "input 'input' axis 0: need min <= opt <= max, got 4, 1, 8" in text
    assert "input 'extra' has dynamic dims ['batch', 'seq'] but profile 0 gives it no shapes" in text
    locs = [p["loc"] for p in problems]
    assert ["spec", "profiles", 0, "ghost"] in locs and ["spec", "profiles", 0, "extra"] in locs
    assert len(problems) >= 4


def test_validate_dynamic_input_without_any_shapes():
    problems = validate_spec(BuildSpec(), info(IMAGE), [T("tensorrt-rtx/sm86")])
    assert len(problems) == 1
    assert (
        "input 'input' has dynamic dims ['batch', 3, 32, 32]: give static 'shapes' or min/opt/max 'profiles'"
        == problems[0]["msg"]
    )


def test_validate_fixed_axis_must_match_model():
    problems = validate_spec(BuildSpec(shapes={"input": [1, 3, 64, 64]}), info(IMAGE), [T("tensorrt-rtx/sm86")])
    assert "axis 2 is fixed at 32 in the model, spec gives 64/64/64" in msgs(problems)


def test_validate_dim_out_of_range():
    problems = validate_spec(BuildSpec(shapes={"input": [0, 3, 32, 32]}), info(IMAGE), [T("tensorrt-rtx/sm86")])
    assert "has a dim outside 1.." in msgs(problems)


def test_validate_static_model_needs_no_shapes():
    assert validate_spec(BuildSpec(), info(STATIC), [T("tensorrt-rtx/sm86")]) == []


def test_validate_int8_without_qdq():
    problems = validate_spec(BuildSpec(precision="int8"), info(STATIC), [T("tensorrt-rtx/sm86")])
    assert problems[0]["loc"] == ["spec", "precision"]
    assert "Q/DQ" in problems[0]["msg"] and "calibration samples" in problems[0]["msg"]
    assert validate_spec(BuildSpec(precision="int8"), info(STATIC, has_qdq=True), [T("tensorrt-rtx/sm86")]) == []
    # With samples the farm makes the Q/DQ model itself; fp8 still needs one.
    assert validate_spec(BuildSpec(precision="int8"), info(STATIC), [T("tensorrt-rtx/sm86")], has_samples=True) == []
    fp8 = validate_spec(BuildSpec(precision="fp8"), info(STATIC), [T("tensorrt-rtx/sm89")], has_samples=True)
    assert "this model has none" in fp8[0]["msg"]


def test_validate_bf16_on_rtx_sm75():
    problems = validate_spec(
        BuildSpec(precision="bf16", precision_fallback=False), info(STATIC), [T("tensorrt-rtx/sm75")]
    )
    assert msgs(problems) == "tensorrt-rtx/sm75: bf16 needs compute capability 8.0 or newer, sm75 is 7.5"
    assert all(p["loc"] == ["targets", "tensorrt-rtx/sm75"] for p in problems)
    rtx = validate_spec(BuildSpec(precision="bf16", precision_fallback=False), info(STATIC), [T("tensorrt-rtx/sm86")])
    assert "tensorrt-rtx builds strongly typed networks" in msgs(rtx)


def test_validate_bf16_on_full_tensorrt_ampere_is_fine():
    assert validate_spec(BuildSpec(precision="bf16"), info(STATIC), [T("tensorrt/sm86")]) == []


def test_validate_fp8_needs_ada():
    problems = validate_spec(
        BuildSpec(precision="fp8"), info(STATIC, has_qdq=True), [T("tensorrt/sm86"), T("tensorrt/sm89")]
    )
    assert msgs(problems) == "tensorrt/sm86: fp8 needs compute capability 8.9 or newer, sm86 is 8.6"


def test_validate_precisions_on_onnxruntime():
    """ONNX Runtime's CPU kernels run the fp16 graph (1.32 has fp16 Conv and MatMul); bf16 they do not."""
    targets = [T("onnxruntime/cpu-x86_64"), T("tensorrt-rtx/sm86")]
    assert validate_spec(BuildSpec(precision="fp16"), info(STATIC), targets) == []
    problems = validate_spec(BuildSpec(precision="bf16", precision_fallback=False), info(STATIC), targets)
    assert [p["loc"] for p in problems] == [["targets", "onnxruntime/cpu-x86_64"], ["targets", "tensorrt-rtx/sm86"]]
    assert "the CPU backend builds fp32, fp16 or int8 (Q/DQ), not bf16" in problems[0]["msg"]


def test_validate_duplicate_targets():
    problems = validate_spec(
        BuildSpec(), info(STATIC), [T("tensorrt-rtx/sm86"), T("tensorrt-rtx/sm89"), T("tensorrt-rtx/sm86")]
    )
    assert msgs(problems) == "target tensorrt-rtx/sm86 is listed twice"


def test_validate_ampere_plus_targets():
    s = BuildSpec(hardware_compatibility="ampere_plus")
    problems = validate_spec(s, info(STATIC), [T("tensorrt/sm75"), T("tensorrt/sm87"), T("tensorrt/sm86")])
    text = msgs(problems)
    assert "tensorrt/sm75: hardware compatibility ampere_plus needs an sm80+ target" in text
    assert "tensorrt/sm87: ampere_plus engines are not supported on Jetson" in text
    assert "tensorrt/sm86" not in text


# --------------------------------------------------------------------------- trtexec shapes


def test_parse_trtexec_shapes():
    assert parse_trtexec_shapes("input:1x3x224x224,mask:1x128") == {"input": [1, 3, 224, 224], "mask": [1, 128]}
    assert parse_trtexec_shapes(" 'input':1X3 , ") == {"input": [1, 3]}
    assert parse_trtexec_shapes("encoder:0:2x8") == {"encoder:0": [2, 8]}  # names may hold colons
    assert parse_trtexec_shapes("") == {}


@pytest.mark.parametrize(
    "text, words",
    [
        ("1x3x224x224", "must be NAME:DxDxD"),
        (":1x3", "must be NAME:DxDxD"),
        ("input:1xAx3", "dims must be integers separated by 'x'"),
        ("input:", "dims must be integers"),
        ("input:1,3", "must be NAME:DxDxD"),
    ],
)
def test_parse_trtexec_shapes_malformed(text, words):
    with pytest.raises(ValueError, match=words):
        parse_trtexec_shapes(text)


def test_spec_shapes_from_trtexec_profiles():
    out = spec_shapes_from_trtexec(
        min_shapes="input:1x3x32x32", opt_shapes="input:4x3x32x32", max_shapes="input:8x3x32x32", shapes="mask:1x128"
    )
    assert out == {
        "shapes": {"mask": [1, 128]},
        "profiles": [{"input": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}}],
    }
    spec = BuildSpec(**out)  # the result is a valid spec
    assert spec.normalized_profiles()[0]["mask"].opt == [1, 128]


def test_spec_shapes_from_trtexec_opt_defaults_to_max():
    out = spec_shapes_from_trtexec(min_shapes="input:1x3", max_shapes="input:8x3")
    assert out["profiles"] == [{"input": {"min": [1, 3], "opt": [8, 3], "max": [8, 3]}}]


def test_spec_shapes_from_trtexec_static_only():
    assert spec_shapes_from_trtexec(shapes="input:1x3x32x32") == {"shapes": {"input": [1, 3, 32, 32]}}
    assert spec_shapes_from_trtexec() == {}


def test_spec_shapes_from_trtexec_missing_max():
    with pytest.raises(ValueError, match=r"inputs \['input'\] need both --minShapes and --maxShapes"):
        spec_shapes_from_trtexec(min_shapes="input:1x3", opt_shapes="input:4x3")
    with pytest.raises(ValueError, match=r"\['mask'\]"):
        spec_shapes_from_trtexec(min_shapes="input:1x3", max_shapes="input:8x3,mask:1x4")


def test_spec_shapes_from_trtexec_malformed():
    with pytest.raises(ValueError, match="dims must be integers"):
        spec_shapes_from_trtexec(min_shapes="input:1x?", max_shapes="input:8x3")


# --------------------------------------------------------------------------- what TensorRT would hit, caught first


IDS = TensorInfo("input_ids", "INT64", ["batch", "sequence"])
MASK = TensorInfo("attention_mask", "INT64", ["batch", "sequence"])


def _bert_profile(mask_min_batch: int) -> BuildSpec:
    return BuildSpec(
        profiles=[
            {
                "input_ids": {"min": [1, 8], "opt": [2, 64], "max": [4, 128]},
                "attention_mask": {"min": [mask_min_batch, 8], "opt": [2, 64], "max": [4, 128]},
            }
        ]
    )


def test_validate_shared_named_dims_must_agree_in_each_profile():
    assert validate_spec(_bert_profile(1), info(IDS, MASK), [T("tensorrt-rtx/sm86")]) == []
    problems = validate_spec(_bert_profile(2), info(IDS, MASK), [T("tensorrt-rtx/sm86")])
    assert len(problems) == 1
    assert (
        "share the dim 'batch'" in problems[0]["msg"]
        and "min gives 'input_ids' axis 0 = 1, 'attention_mask' axis 0 = 2" in problems[0]["msg"]
    )


@pytest.mark.parametrize("anonymous", ["?", "", "unk"])
def test_validate_anonymous_dims_are_distinct(anonymous):
    a = TensorInfo("a", "float", [anonymous, 4])
    b = TensorInfo("b", "float", [anonymous, 4])
    spec = BuildSpec(
        profiles=[
            {"a": {"min": [1, 4], "opt": [1, 4], "max": [1, 4]}, "b": {"min": [3, 4], "opt": [3, 4], "max": [3, 4]}}
        ]
    )
    assert validate_spec(spec, info(a, b), [T("tensorrt-rtx/sm86")]) == []


def test_validate_fp32_gemm_on_rtx_turing_is_refused_with_its_source():
    gemm = info(STATIC)
    gemm.op_types = {"MatMul": 12, "Softmax": 2}
    strict = BuildSpec(precision_fallback=False)
    problems = validate_spec(strict, gemm, [T("tensorrt-rtx/sm75"), T("tensorrt-rtx/sm86")])
    assert [p["loc"] for p in problems] == [["targets", "tensorrt-rtx/sm75"]]
    msg = problems[0]["msg"]
    assert "FP32 GEMM is not supported" in msg and "12 MatMul" in msg and "build fp16 for sm75" in msg
    assert "source: TensorRT-RTX support matrix" in msg
    assert validate_spec(BuildSpec(precision="fp16"), gemm, [T("tensorrt-rtx/sm75")]) == []
    int8 = validate_spec(BuildSpec(precision="int8"), gemm, [T("tensorrt-rtx/sm75")], has_samples=True)
    assert "int8 Q/DQ model dequantizes into fp32" in int8[0]["msg"]
    conv = info(STATIC)
    conv.op_types = {"Conv": 3}
    assert validate_spec(BuildSpec(), conv, [T("tensorrt-rtx/sm75")]) == []


def test_a_target_that_cannot_build_the_precision_builds_the_nearest_it_can_and_says_why():
    """One request for targets of different abilities is not refused whole: by default each target builds the
    nearest float precision it can, recorded with the reason; quantized precisions never fall back."""
    gemm = info(STATIC)
    gemm.op_types = {"MatMul": 12}
    targets = [T("tensorrt-rtx/sm75"), T("tensorrt-rtx/sm86"), T("onnxruntime/cpu-x86_64")]
    assert validate_spec(BuildSpec(), gemm, targets) == []
    built = {str(t): target_precision(BuildSpec(), t, gemm) for t in targets}
    assert built["tensorrt-rtx/sm86"] == (Precision.FP32, None) and built["onnxruntime/cpu-x86_64"] == (
        Precision.FP32,
        None,
    )
    p, why = built["tensorrt-rtx/sm75"]
    assert (
        p is Precision.FP16 and why.startswith("built fp16 instead of fp32: ") and "FP32 GEMM is not supported" in why
    )
    # bf16: a Turing GPU builds fp16, the CPU fp32; tensorrt-rtx has no bf16 at all.
    bf16 = BuildSpec(precision="bf16")
    assert target_precision(bf16, T("tensorrt/sm75"), gemm)[0] is Precision.FP16
    assert target_precision(bf16, T("onnxruntime/cpu-x86_64"), gemm)[0] is Precision.FP32
    assert target_precision(bf16, T("tensorrt-rtx/sm86"), gemm)[0] is Precision.FP16
    int8 = validate_spec(BuildSpec(precision="int8"), gemm, [T("tensorrt-rtx/sm75")], has_samples=True)
    assert [p["loc"] for p in int8] == [["targets", "tensorrt-rtx/sm75"]]
    # Specs stored before the field existed keep their hash; asking for no fallback is another spec.
    assert BuildSpec().spec_hash() == BuildSpec(precision_fallback=True).spec_hash()
    assert BuildSpec().spec_hash() != BuildSpec(precision_fallback=False).spec_hash()


def test_validate_value_ranges_and_keep_lists_name_real_things():
    model = info(STATIC)
    model.op_types = {"Conv": 3, "Softmax": 1}
    spec = BuildSpec(
        precision="fp16",
        keep_fp32_ops=["Softmax", "LayerNorm"],
        benchmark={"value_ranges": {"input": (0, 1), "ids": (0, 5)}},
    )
    text = msgs(validate_spec(spec, model, [T("tensorrt-rtx/sm86")]))
    assert "unknown input 'ids'" in text and "no 'LayerNorm' nodes" in text and "'Softmax'" not in text.split("its")[0]
    with pytest.raises(pydantic.ValidationError, match="low <= high"):
        BuildSpec(benchmark={"value_ranges": {"input": (2, 1)}})


def test_parse_val_ranges_polygraphy_syntax():
    from enginefarm.core.shapes import parse_val_ranges

    assert parse_val_ranges(["input_ids:[0,30521]", "x:[-1.5, 2]"]) == {"input_ids": (0.0, 30521.0), "x": (-1.5, 2.0)}
    with pytest.raises(ValueError, match="NAME:\\[LOW,HIGH\\]"):
        parse_val_ranges(["input_ids=0,5"])
    with pytest.raises(ValueError, match="two numbers"):
        parse_val_ranges(["x:[a,b]"])


def test_new_spec_fields_keep_old_hashes_until_used():
    plain = BuildSpec(shapes={"input": [1, 3, 32, 32]})
    assert set(plain.canonical()) == {
        "precision",
        "workspace_mib",
        "optimization_level",
        "hardware_compatibility",
        "version_compatible",
        "timing_cache",
        "strongly_typed",
        "profiles",
    }
    for changed in (
        {"keep_fp32_ops": ["Softmax"]},
        {"graph_cleanup": "onnxslim"},
        {"calibration": {"method": "entropy"}},
        {"keep_io_types": False},
    ):
        other = BuildSpec(shapes={"input": [1, 3, 32, 32]}, **changed)
        assert other.spec_hash() != plain.spec_hash()
        assert BuildSpec(**other.stored()).spec_hash() == other.spec_hash()


def test_validate_ranges_and_fixed_values_against_what_the_graph_knows():
    model = info(TensorInfo("input_ids", "INT64", [1, 8]), TensorInfo("sr", "INT64", []))
    model.index_ranges = {"input_ids": [0, 30521]}
    spec = BuildSpec(fixed_inputs={"sr": 16000.5}, benchmark={"value_ranges": {"input_ids": (0, 99999)}})
    text = msgs(validate_spec(spec, model, [T("tensorrt-rtx/sm86")]))
    assert "indexes a table of 30522 rows: its values must stay within 0..30521, not [0, 99999]" in text
    assert "input 'sr' is INT64: give whole numbers, not 16000.5" in text
    fine = BuildSpec(fixed_inputs={"sr": 16000}, benchmark={"value_ranges": {"input_ids": (0, 30521)}})
    assert validate_spec(fine, model, [T("tensorrt-rtx/sm86")]) == []


def test_fixed_input_values_must_be_rectangular_numbers():
    """Was broken: a ragged value passed validation, got the shape of its first row, and crashed the worker."""
    with pytest.raises(pydantic.ValidationError, match="must be rectangular"):
        BuildSpec(fixed_inputs={"state": [[1, 2], [3]]})
    with pytest.raises(pydantic.ValidationError, match="finite numbers"):
        BuildSpec(fixed_inputs={"sr": [1.0, float("nan")]})
    with pytest.raises(pydantic.ValidationError, match="at most 4096 values"):
        BuildSpec(fixed_inputs={"x": [0] * 5000})
    assert BuildSpec(fixed_inputs={"state": [[1, 2], [3, 4]]}).fixed_inputs["state"] == [[1, 2], [3, 4]]


def _errors(**spec) -> list[tuple[tuple, str]]:
    with pytest.raises(pydantic.ValidationError) as caught:
        BuildSpec(**spec)
    return [(e["loc"], e["msg"]) for e in caught.value.errors()]


def test_profiles_may_not_repeat_and_are_capped():
    """Was broken: 2,000 identical profiles were accepted and handed to the builder."""
    rng = {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}
    other = {**rng, "max": [16, 3, 32, 32]}
    [(loc, msg)] = _errors(profiles=[{"input": rng}, {"input": other}, {"input": rng}, {"input": other}])
    assert loc == ("profiles",)
    assert "profiles repeat: profile 2 repeats profile 0, profile 3 repeats profile 1" in msg, msg
    [(loc, msg)] = _errors(profiles=[{"input": rng}] * 2000)
    assert "profile 1 repeats profile 0" in msg and len(msg) < 500, msg  # says which, without listing 2,000
    many = [{"input": {**rng, "max": [8 + i, 3, 32, 32]}} for i in range(MAX_PROFILES + 1)]
    [(loc, msg)] = _errors(profiles=many)
    assert f"at most {MAX_PROFILES} optimization profiles, not {MAX_PROFILES + 1}" in msg, msg
    assert len(BuildSpec(profiles=many[:MAX_PROFILES]).profiles) == MAX_PROFILES


@pytest.mark.parametrize(
    "tolerances, says",
    [
        ({"atol": -1e-3}, "['atol'] must be finite numbers >= 0"),
        ({"rtol": float("nan"), "max_abs": -1}, "['max_abs', 'rtol'] must be finite numbers >= 0"),
        ({"cosine": 1.5}, "['cosine'] must be at most 1"),
        ({"violations": 2.0, "agreement": 1.01}, "['agreement', 'violations'] must be at most 1"),
    ],
)
def test_tolerances_outside_their_range(tolerances, says):
    [(loc, msg)] = _errors(accuracy={"tolerances": tolerances})
    assert loc == ("accuracy", "tolerances") and says in msg, (loc, msg)


@pytest.mark.parametrize(
    "spec, loc",
    [
        ({"optimization_level": True}, ("optimization_level",)),
        ({"workspace_mib": "64"}, ("workspace_mib",)),
        ({"shapes": {"input": [True, 3, 32, 32]}}, ("shapes", "input", 0)),
        ({"profiles": [{"input": {"min": [1], "opt": [1], "max": [False]}}]}, ("profiles", 0, "input", "max", 0)),
        ({"benchmark": {"iterations": True}}, ("benchmark", "iterations")),
        ({"benchmark": {"duration_s": True}}, ("benchmark", "duration_s")),
        ({"benchmark": {"batch_sizes": [True]}}, ("benchmark", "batch_sizes", 0)),
        ({"benchmark": {"value_ranges": {"x": [False, 1]}}}, ("benchmark", "value_ranges", "x", 0)),
        ({"benchmark": {"cuda_graph": 1}}, ("benchmark", "cuda_graph")),
        ({"accuracy": {"seed": True}}, ("accuracy", "seed")),
        ({"accuracy": {"tolerances": {"atol": True}}}, ("accuracy", "tolerances", "atol")),
        ({"calibration": {"batch": True}}, ("calibration", "batch")),
        ({"timing_cache": 0}, ("timing_cache",)),
    ],
)
def test_spec_numbers_and_flags_take_no_other_json_type(spec, loc):
    """Was broken: ``true`` read as 1 and ``"64"`` as 64 wherever a spec takes a number."""
    assert [e[0] for e in _errors(**spec)] == [loc]


def test_stored_specs_still_load():
    spec = BuildSpec(
        precision="fp16",
        profiles=[{"input": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}}],
        benchmark={"duration_s": 1, "value_ranges": {"input": (0, 1.5)}},
        accuracy={"tolerances": {"atol": 0, "cosine": 1}},
    )
    assert BuildSpec(**json.loads(json.dumps(spec.stored()))).spec_hash() == spec.spec_hash()


@pytest.mark.parametrize(
    "name, version, where, says",
    [
        ("..", None, "name", "starting with a letter or digit"),
        (".", None, "name", "starting with a letter or digit"),
        ("_x", None, "name", "starting with a letter or digit"),
        ("\uff4d\uff4f\uff44\uff45\uff4c", None, "name", "U+FF4D FULLWIDTH LATIN SMALL LETTER M"),
        ("te\u0430m", None, "name", "U+0430 CYRILLIC SMALL LETTER A"),
        ("ok", "latest", "version", "'latest' is reserved"),
        ("ok", "LaTeSt", "version", "is reserved"),
        ("ok", "..", "version", "starting with a letter or digit"),
        ("ok", "\u0661", "version", "U+0661 ARABIC-INDIC DIGIT ONE"),
    ],
)
def test_model_names_and_versions(name, version, where, says):
    [problem] = check_model_name(name, version)
    assert problem["loc"] == [where] and says in problem["msg"], problem


def test_allowed_model_names_and_versions():
    assert check_model_name("resnet50_v1.5-int8", "2024.01+cu12") == []
    assert check_model_name("a" * 200, "1" * 100) == []
    assert check_model_name("latest", "latest-but-one") == []  # only a version can be the selector


@pytest.mark.parametrize(
    "project, says",
    [
        ("te\u0430m", "U+0430 CYRILLIC SMALL LETTER A"),
        ("..", "starting with a letter or digit"),
        ("x" * 65, "1-64"),
        ("", "1-64"),
    ],
)
def test_project_names(project, says):
    assert says in project_problem(project)
    assert project_problem("team-a_1.prod") is None


def test_fixed_values_match_boolean_or_numeric_inputs():
    """Was broken: ``true`` fixed into an INT64 input was read as 1, and 2 into a BOOL input as true."""
    model = info(TensorInfo("sr", "INT64", []), TensorInfo("flag", "BOOL", []), TensorInfo("gain", "FLOAT", [2]))
    target = [T("tensorrt-rtx/sm86")]
    text = msgs(validate_spec(BuildSpec(fixed_inputs={"sr": True, "flag": 2, "gain": [0.5, False]}), model, target))
    assert "input 'sr' is INT64: give numbers, not true or false" in text
    assert "input 'gain' is FLOAT: give numbers, not true or false" in text
    assert "input 'flag' is BOOL: give true or false, not 2" in text
    fine = BuildSpec(fixed_inputs={"sr": 16000, "flag": True, "gain": [0.5, 1]})
    assert validate_spec(fine, model, target) == []
