"""``enginefarm.client.triton``: repository layout and config.pbtxt, parsed back against Triton's field names.

Every config.pbtxt is parsed with ``text_format.Parse`` against ``tests/triton_model_config.py``,
which declares Triton's ModelConfig fields by their documented names and numbers; Parse fails on
any unknown field or enum value. Engine files are fake bytes: the layout is under test, not TensorRT.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper

from enginefarm.client.triton import (
    ONNX_TO_TRITON,
    TritonRepository,
    render_config,
    sanitize_model_name,
    write_repository,
)
from enginefarm.client.tritonexport import config_spec
from enginefarm.client.tritonplans import RTX_WARNING
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.graph.samples import conv_net, sample_spec
from tests.triton_model_config import DataType, ModelConfig, ModelInstanceGroup

FP32 = DataType.values_by_name["TYPE_FP32"].number

GPU = ModelInstanceGroup.Kind.Value("KIND_GPU")
CPU = ModelInstanceGroup.Kind.Value("KIND_CPU")


# --------------------------------------------------------------------------- helpers


def parse(text: str) -> Any:
    return text_format.Parse(text, ModelConfig())


def load_config(model_dir: Path) -> Any:
    return parse((model_dir / "config.pbtxt").read_text(encoding="utf-8"))


def tensor(name: str, dtype: str, dims: list[Any]) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "dims": dims}


def model_of(proto: onnx.ModelProto, tmp_path: Path, name: str = "net") -> tuple[dict[str, Any], Path]:
    """Save ``proto`` and describe it the way the catalog does (ModelOut's keys)."""
    path = tmp_path / "uploads" / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(path))
    info = inspect_upload(path, tmp_path / "work").info.to_dict()
    model = {
        "id": 1,
        "name": name,
        "version": "1",
        "sha256": "0" * 64,
        "format": "onnx",
        "inputs": info["inputs"],
        "outputs": info["outputs"],
    }
    return model, path


def elementwise(
    inputs: list[tuple[str, list[Any]]], out_dims: list[Any], dtype: int = TensorProto.FLOAT
) -> onnx.ModelProto:
    """Sum of the inputs (one input: Identity) with the given declared output shape."""
    names = [n for n, _ in inputs]
    node = helper.make_node("Sum" if len(names) > 1 else "Identity", names, ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, dtype, d) for n, d in inputs],
        [helper.make_tensor_value_info("y", dtype, out_dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def engine(cc: str, backend: str = "tensorrt", precision: str = "fp16", eid: int = 1) -> dict[str, Any]:
    arch = "sm" + cc.replace(".", "")
    return {
        "id": eid,
        "target": f"{backend}/{arch}",
        "backend": backend,
        "compute_capability": cc,
        "compute_capabilities": [cc],
        "sha256": "e" * 64,
        "size": 16,
        "precision": precision,
    }


def plans(
    tmp_path: Path, *ccs: str, backend: str = "tensorrt", precision: str = "fp16"
) -> dict[str, tuple[dict, Path]]:
    """Fake downloaded engine files, one per compute capability, each with distinct bytes."""
    out = {}
    for i, cc in enumerate(ccs):
        path = tmp_path / "downloads" / f"engine-{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"plan for {cc}".encode())
        out[cc] = (engine(cc, backend, precision, eid=i + 1), path)
    return out


def others(warnings: list[str]) -> list[str]:
    """The warnings besides the one that says there is no default plan."""
    return [w for w in warnings if not w.startswith("no default_model_filename")]


def profile(**ranges: tuple[list[int], list[int], list[int]]) -> dict[str, dict[str, list[int]]]:
    return {name: {"min": lo, "opt": opt, "max": hi} for name, (lo, opt, hi) in ranges.items()}


# --------------------------------------------------------------------------- static and dynamic shapes


def test_static_model_layout_and_config(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(dynamic_batch=False), tmp_path, "resnet")
    engines = plans(tmp_path, "8.6", "12.0", "7.5")
    repo = tmp_path / "repo"
    result = write_repository(repo, model, {"precision": "fp16", "profiles": []}, engines, onnx_path)

    assert result.models == ["resnet", "resnet_onnx"]
    assert sorted(p.name for p in repo.iterdir()) == ["resnet", "resnet_onnx"]
    cfg = load_config(repo / "resnet")
    assert cfg.name == "resnet" and cfg.platform == "tensorrt_plan"
    assert cfg.max_batch_size == 0
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("input", FP32, [1, 3, 32, 32])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("logits", [1, 10])]
    assert not cfg.HasField("dynamic_batching")
    assert [(g.kind, g.count) for g in cfg.instance_group] == [(GPU, 1)]
    assert dict(cfg.cc_model_filenames) == {
        "7.5": "model_sm75.plan",
        "8.6": "model_sm86.plan",
        "12.0": "model_sm120.plan",
    }
    # No plan here runs beyond its own compute capability: no default, which Triton would hand to any other GPU.
    assert not cfg.default_model_filename
    vdir = repo / "resnet" / "1"
    for cc, filename in cfg.cc_model_filenames.items():
        assert (vdir / filename).read_bytes() == engines[cc][1].read_bytes()

    fallback = load_config(repo / "resnet_onnx")
    assert fallback.name == "resnet_onnx" and fallback.platform == "onnxruntime_onnx"
    assert [(g.kind, g.count) for g in fallback.instance_group] == [(CPU, 1)]
    assert fallback.max_batch_size == 0 and list(fallback.input[0].dims) == [1, 3, 32, 32]
    assert not fallback.cc_model_filenames
    assert (repo / "resnet_onnx" / "1" / fallback.default_model_filename).read_bytes() == onnx_path.read_bytes()

    on_disk = sorted(p for p in repo.rglob("*") if p.is_file())
    assert sorted(result.files) == on_disk
    (warning,) = result.warnings
    assert (
        warning.startswith("no default_model_filename")
        and "compute capability 7.5, 8.6, 12.0 and on no other" in warning
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo.staging-")]


def test_the_farms_cuda_artifacts_go_on_the_gpu_with_the_options_measured_fastest(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(dynamic_batch=False), tmp_path, "resnet")
    artifacts = {}
    for cc, options in (("8.6", {"prefer_nhwc": "1", "enable_cuda_graph": "1"}), ("9.0", {"prefer_nhwc": "1"})):
        path = tmp_path / "downloads" / f"cuda-{cc}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"graph for {cc}".encode())
        record = {**engine(cc, "onnxruntime", "fp16"), "run_options": {**options, "gpu_mem_limit": "1"}}
        record["target"] = f"onnxruntime/cuda-sm{cc.replace('.', '')}"
        artifacts[cc] = (record, path)
    repo = tmp_path / "repo"
    result = write_repository(repo, model, {"profiles": []}, {}, onnx_path, ort_gpu=artifacts)
    assert result.models == ["resnet_ort_gpu", "resnet_onnx"]
    cfg = load_config(repo / "resnet_ort_gpu")
    assert cfg.platform == "onnxruntime_onnx" and [(g.kind, g.count) for g in cfg.instance_group] == [(GPU, 1)]
    assert dict(cfg.cc_model_filenames) == {"8.6": "model_sm86.onnx", "9.0": "model_sm90.onnx"}
    assert cfg.default_model_filename == "model_sm90.onnx"
    (accelerator,) = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    # Only what both were measured fastest with, and only options the farm chooses.
    assert accelerator.name == "cuda" and dict(accelerator.parameters) == {"prefer_nhwc": "1"}
    for cc, filename in cfg.cc_model_filenames.items():
        assert (repo / "resnet_ort_gpu" / "1" / filename).read_bytes() == artifacts[cc][1].read_bytes()
    assert not load_config(repo / "resnet_onnx").HasField("optimization")


def test_a_plan_is_not_taken_for_a_cuda_artifact(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(dynamic_batch=False), tmp_path, "resnet")
    with pytest.raises(ValueError, match="not an onnxruntime/cuda artifact"):
        write_repository(tmp_path / "repo", model, {}, {}, onnx_path, ort_gpu=plans(tmp_path, "8.6"))
    assert not (tmp_path / "repo").exists()


def test_dynamic_batch_drops_batch_axis(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(dynamic_batch=True), tmp_path)
    result = write_repository(tmp_path / "repo", model, sample_spec(batch=(1, 4, 8)), plans(tmp_path, "8.6"), onnx_path)
    for name in result.models:
        cfg = load_config(tmp_path / "repo" / name)
        assert cfg.max_batch_size == 8
        assert list(cfg.input[0].dims) == [3, 32, 32]
        assert list(cfg.output[0].dims) == [10]
        assert list(cfg.dynamic_batching.preferred_batch_size) == [4]


def test_other_dynamic_dims_become_minus_one(tmp_path: Path) -> None:
    model, _ = model_of(elementwise([("x", ["N", 3, "H", None])], ["N", 3, "H", 0]), tmp_path)
    spec = {"profiles": [profile(x=([1, 3, 8, 8], [2, 3, 64, 64], [16, 3, 128, 128]))]}
    cfg = parse(render_config(model, spec, name="m", platform="tensorrt_plan"))
    assert cfg.max_batch_size == 16
    assert list(cfg.input[0].dims) == [3, -1, -1]
    assert list(cfg.output[0].dims) == [3, -1, -1]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [2]


def test_dynamic_model_without_profiles_is_not_batchable(tmp_path: Path) -> None:
    model, _ = model_of(elementwise([("x", ["N", 4])], ["N", 4]), tmp_path)
    cfg = parse(render_config(model, {"profiles": []}, name="m", platform="onnxruntime_onnx"))
    assert cfg.max_batch_size == 0
    assert list(cfg.input[0].dims) == [-1, 4] and list(cfg.output[0].dims) == [-1, 4]
    assert not cfg.HasField("dynamic_batching")


def test_plans_with_different_profiles_share_the_smallest_batch(tmp_path: Path) -> None:
    """One config.pbtxt serves every compute capability's plan: its batch limit is one every plan takes."""
    model, _ = model_of(elementwise([("x", ["N", 4])], ["N", 4]), tmp_path)
    wide = {"profiles": [profile(x=([1, 4], [4, 4], [16, 4]))]}
    narrow = {"profiles": [profile(x=([1, 4], [2, 4], [4, 4]))]}
    spec, warnings = config_spec(model, [wide, narrow])
    assert spec == narrow and batching_of(model, spec) == 4
    assert warnings and "max_batch_size is 4" in warnings[0]
    assert config_spec(model, [wide, wide]) == (wide, [])
    assert config_spec(model, []) == ({}, [])


def batching_of(model: dict, spec: dict) -> int:
    return parse(render_config(model, spec, name="m", platform="tensorrt_plan")).max_batch_size


def test_inputs_disagreeing_on_max_batch_take_the_smallest(tmp_path: Path) -> None:
    model, _ = model_of(elementwise([("a", ["N", 4]), ("b", ["N", 4])], ["N", 4]), tmp_path)
    spec = {"profiles": [profile(a=([1, 4], [4, 4], [16, 4]), b=([1, 4], [2, 4], [8, 4]))]}
    cfg = parse(render_config(model, spec, name="m", platform="tensorrt_plan"))
    assert cfg.max_batch_size == 8
    assert [list(i.dims) for i in cfg.input] == [[4], [4]]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [2]


def test_output_with_static_first_dim_is_not_batchable(tmp_path: Path) -> None:
    model, _ = model_of(elementwise([("x", ["N", 4])], [1, 4]), tmp_path)
    spec = {"profiles": [profile(x=([1, 4], [4, 4], [8, 4]))]}
    cfg = parse(render_config(model, spec, name="m", platform="tensorrt_plan"))
    assert cfg.max_batch_size == 0
    assert list(cfg.input[0].dims) == [-1, 4]
    assert list(cfg.output[0].dims) == [1, 4]
    assert not cfg.HasField("dynamic_batching")


def test_profile_missing_an_input_is_not_batchable(tmp_path: Path) -> None:
    model, _ = model_of(elementwise([("a", ["N", 4]), ("b", ["N", 4])], ["N", 4]), tmp_path)
    spec = {"profiles": [profile(a=([1, 4], [4, 4], [16, 4]))]}
    assert parse(render_config(model, spec, name="m", platform="tensorrt_plan")).max_batch_size == 0


def test_batch_min_above_one_is_still_batchable(tmp_path: Path) -> None:
    model, _ = model_of(elementwise([("x", ["N", 4])], ["N", 4]), tmp_path)
    spec = {"profiles": [profile(x=([4, 4], [4, 4], [4, 4]))]}
    cfg = parse(render_config(model, spec, name="m", platform="tensorrt_plan"))
    assert cfg.max_batch_size == 4 and list(cfg.dynamic_batching.preferred_batch_size) == [4]


def test_rank_one_tensors_are_reshaped_to_scalars_when_batching(tmp_path: Path) -> None:
    model, _ = model_of(elementwise([("x", ["N"])], ["N"], TensorProto.INT64), tmp_path)
    spec = {"profiles": [profile(x=([1], [8], [64]))]}
    cfg = parse(render_config(model, spec, name="m", platform="tensorrt_plan"))
    assert cfg.max_batch_size == 64
    for t in (cfg.input[0], cfg.output[0]):
        assert list(t.dims) == [1]
        assert t.HasField("reshape") and list(t.reshape.shape) == []


def test_several_profiles(tmp_path: Path) -> None:
    model, onnx_path = model_of(elementwise([("x", ["N", 4])], ["N", 4]), tmp_path)
    small = profile(x=([1, 4], [2, 4], [8, 4]))
    large = profile(x=([8, 4], [16, 4], [32, 4]))
    tiny = profile(x=([1, 4], [2, 4], [4, 4]))
    result = write_repository(
        tmp_path / "repo", model, {"profiles": [small, large, tiny]}, plans(tmp_path, "8.9"), onnx_path
    )
    for name in result.models:
        cfg = load_config(tmp_path / "repo" / name)
        assert cfg.max_batch_size == 32
        assert list(cfg.dynamic_batching.preferred_batch_size) == [2, 16]
    (warning,) = others(result.warnings)
    assert "profile 0 batches only up to 8" in warning and "max_batch_size is 32" in warning

    result = write_repository(
        tmp_path / "repo", model, {"profiles": [large, small, tiny]}, plans(tmp_path, "8.9"), onnx_path, overwrite=True
    )
    assert load_config(tmp_path / "repo" / "net").max_batch_size == 32
    assert others(result.warnings) == []

    onnx_only = write_repository(tmp_path / "cpu", model, {"profiles": [small, large]}, {}, onnx_path)
    assert onnx_only.warnings == []


# --------------------------------------------------------------------------- data types


@pytest.mark.parametrize("onnx_type", sorted(ONNX_TO_TRITON))
def test_data_types(onnx_type: str) -> None:
    model = {"inputs": [tensor("x", onnx_type, [2])], "outputs": [tensor("y", onnx_type, [2])]}
    cfg = parse(render_config(model, {"profiles": []}, name="m", platform="onnxruntime_onnx"))
    assert DataType.values_by_number[cfg.input[0].data_type].name == ONNX_TO_TRITON[onnx_type]
    assert cfg.output[0].data_type == cfg.input[0].data_type


def test_data_type_numbers_match_triton() -> None:
    numbers = {v.name: v.number for v in DataType.values}
    assert numbers["TYPE_FP32"] == 11 and numbers["TYPE_BF16"] == 14 and numbers["TYPE_STRING"] == 13
    assert set(ONNX_TO_TRITON.values()) == set(numbers) - {"TYPE_INVALID"}


@pytest.mark.parametrize("onnx_type", ["FLOAT8E4M3FN", "COMPLEX64", "SEQUENCE", "UNDEFINED"])
def test_unsupported_data_type(onnx_type: str, tmp_path: Path) -> None:
    model = {"name": "m", "inputs": [tensor("x", "FLOAT", [2])], "outputs": [tensor("scores", onnx_type, [2])]}
    with pytest.raises(ValueError, match=rf"'scores'.*{onnx_type}"):
        render_config(model, {"profiles": []}, name="m", platform="tensorrt_plan")
    with pytest.raises(ValueError, match="scores"):
        write_repository(tmp_path / "repo", model, {"profiles": []}, plans(tmp_path, "8.6"), None)
    assert not (tmp_path / "repo").exists()


# --------------------------------------------------------------------------- bundles


def test_bundle_with_external_data(tmp_path: Path) -> None:
    unpacked = tmp_path / "unpacked"
    (unpacked / "net").mkdir(parents=True)
    onnx.save_model(
        conv_net(channels=8),
        str(unpacked / "net" / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    (unpacked / "README.txt").write_text("bundle notes")
    model, _ = model_of(conv_net(channels=8), tmp_path, "bundled")
    model["format"] = "zip"

    repo = tmp_path / "repo"
    result = write_repository(
        repo, model, sample_spec(), plans(tmp_path, "8.6"), unpacked, onnx_member="net/model.onnx"
    )
    vdir = repo / "bundled_onnx" / "1"
    cfg = load_config(repo / "bundled_onnx")
    assert cfg.default_model_filename == "net/model.onnx"
    assert (vdir / "net" / "weights.bin").read_bytes() == (unpacked / "net" / "weights.bin").read_bytes()
    assert (vdir / "README.txt").exists()
    assert vdir / "net" / "weights.bin" in result.files

    session = ort.InferenceSession(str(vdir / cfg.default_model_filename), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input": np.zeros((2, 3, 32, 32), np.float32)})
    assert logits.shape == (2, 10)


@pytest.mark.parametrize("member", ["../outside.onnx", "missing.onnx", "/etc/passwd"])
def test_bundle_member_must_be_inside(member: str, tmp_path: Path) -> None:
    (tmp_path / "unpacked").mkdir()
    (tmp_path / "outside.onnx").write_bytes(b"x")
    model = {"name": "m", "inputs": [], "outputs": []}
    with pytest.raises(ValueError, match="not a file inside"):
        write_repository(tmp_path / "repo", model, {"profiles": []}, {}, tmp_path / "unpacked", onnx_member=member)


# --------------------------------------------------------------------------- existing directories, names, versions


def test_existing_model_directory_is_refused_then_overwritten(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    repo = tmp_path / "repo"
    write_repository(repo, model, sample_spec(), plans(tmp_path, "8.6"), onnx_path)
    (repo / "other_model").mkdir()
    with pytest.raises(FileExistsError, match="overwrite"):
        write_repository(repo, model, sample_spec(), plans(tmp_path, "8.9"), onnx_path)
    assert dict(load_config(repo / "net").cc_model_filenames) == {"8.6": "model_sm86.plan"}

    write_repository(repo, model, sample_spec(), plans(tmp_path, "8.9"), onnx_path, version=2, overwrite=True)
    assert dict(load_config(repo / "net").cc_model_filenames) == {"8.9": "model_sm89.plan"}
    assert sorted(p.name for p in (repo / "net").iterdir()) == ["2", "config.pbtxt"]
    assert sorted(p.name for p in repo.iterdir()) == ["net", "net_onnx", "other_model"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo.staging-")]


def test_only_the_onnx_fallback(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    result = write_repository(tmp_path / "repo", model, sample_spec(), {}, onnx_path)
    assert result.models == ["net_onnx"] and not (tmp_path / "repo" / "net").exists()
    with pytest.raises(ValueError, match="nothing to write"):
        write_repository(tmp_path / "repo2", model, sample_spec(), {}, None)


@pytest.mark.parametrize(
    ("raw", "safe"),
    [
        ("resnet50", "resnet50"),
        ("my model/v2:β", "my_model_v2__"),
        ("a.b-c_d", "a.b-c_d"),
        ("..", "_."),
        (".hidden", "_hidden"),
        ('q"uote\\', "q_uote_"),
    ],
)
def test_sanitize_model_name(raw: str, safe: str) -> None:
    assert sanitize_model_name(raw) == safe


def test_catalog_name_is_sanitized_and_override_is_checked(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    model["name"] = "team/resnet 50"
    result = write_repository(tmp_path / "repo", model, sample_spec(), plans(tmp_path, "8.6"), onnx_path)
    assert result.models == ["team_resnet_50", "team_resnet_50_onnx"]
    for name in result.models:
        assert load_config(tmp_path / "repo" / name).name == name

    result = write_repository(tmp_path / "repo", model, sample_spec(), plans(tmp_path, "8.6"), onnx_path, name="rn50")
    assert load_config(tmp_path / "repo" / "rn50").name == "rn50"
    with pytest.raises(ValueError, match="ASCII letters"):
        write_repository(tmp_path / "repo", model, sample_spec(), plans(tmp_path, "8.6"), onnx_path, name="../x")


@pytest.mark.parametrize("version", [0, -1, True, "1", 1.0])
def test_version_must_be_a_positive_integer(version: Any, tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    with pytest.raises(ValueError, match="positive integers"):
        write_repository(tmp_path / "repo", model, sample_spec(), {}, onnx_path, version=version)


def test_version_directory(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    write_repository(tmp_path / "repo", model, sample_spec(), plans(tmp_path, "12.0"), onnx_path, version=7)
    assert (tmp_path / "repo" / "net" / "7" / "model_sm120.plan").is_file()
    assert (tmp_path / "repo" / "net_onnx" / "7" / "model.onnx").is_file()


def test_bad_engines_are_refused(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    ort_engine = plans(tmp_path, "8.6")
    ort_engine["8.6"][0]["backend"] = "onnxruntime"
    with pytest.raises(ValueError, match="not a TensorRT plan"):
        write_repository(tmp_path / "repo", model, sample_spec(), ort_engine, onnx_path)
    for key in ("sm86", "8.06", "8"):
        with pytest.raises(ValueError, match="MAJOR.MINOR"):
            write_repository(tmp_path / "repo", model, sample_spec(), {key: plans(tmp_path, "8.6")["8.6"]}, onnx_path)
    assert not (tmp_path / "repo").exists()


# --------------------------------------------------------------------------- quoting


@pytest.mark.parametrize(
    "name", ['in"put', "back\\slash", 'both\\"', "new\nline\ttab\r", "ünïcødé 名前", "'single'", ""]
)
def test_names_round_trip_through_text_format(name: str) -> None:
    model = {"inputs": [tensor(name, "FLOAT", [1])], "outputs": [tensor(name + "_out", "FLOAT", [1])]}
    cfg = parse(
        render_config(
            model,
            {"profiles": []},
            name=name,
            platform="tensorrt_plan",
            cc_model_filenames={"8.6": name + ".plan"},
            default_model_filename=name,
        )
    )
    assert cfg.name == name and cfg.default_model_filename == name
    assert cfg.input[0].name == name and cfg.output[0].name == name + "_out"
    assert dict(cfg.cc_model_filenames) == {"8.6": name + ".plan"}


# --------------------------------------------------------------------------- warnings


def test_tensorrt_rtx_warning(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    rtx = write_repository(
        tmp_path / "a", model, sample_spec(), plans(tmp_path, "8.6", "8.9", backend="tensorrt-rtx"), onnx_path
    )
    assert others(rtx.warnings) == [RTX_WARNING]
    assert "TensorRT-RTX" in RTX_WARNING and "tensorrt_plan" in RTX_WARNING
    plain = write_repository(tmp_path / "b", model, sample_spec(), plans(tmp_path, "8.6"), onnx_path)
    assert others(plain.warnings) == []

    mixed = plans(tmp_path, "8.6", "8.9")
    mixed["8.9"][0]["backend"] = "tensorrt-rtx"
    result = write_repository(tmp_path / "c", model, sample_spec(), mixed, onnx_path)
    assert RTX_WARNING in result.warnings and any("mix TensorRT and TensorRT-RTX" in w for w in result.warnings)


def test_mixed_precision_warning(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    engines = plans(tmp_path, "8.6", "12.0")
    engines["12.0"][0]["precision"] = "int8"
    result = write_repository(tmp_path / "repo", model, sample_spec(), engines, onnx_path)
    assert isinstance(result, TritonRepository)
    (warning,) = others(result.warnings)
    assert warning.startswith("engines mix precisions (fp16 on 8.6, int8 on 12.0)")


# --------------------------------------------------------------------------- the definition itself


def test_definition_rejects_unknown_fields() -> None:
    with pytest.raises(text_format.ParseError):
        parse('name: "m"\nbackend: "tensorrt"\n')
    with pytest.raises(text_format.ParseError):
        parse("instance_group [ { kind: KIND_TPU } ]")


def test_definition_numbers_and_map() -> None:
    def numbers(cls: Any) -> dict[str, int]:
        return {f.name: f.number for f in cls.DESCRIPTOR.fields}

    assert numbers(ModelConfig) == {
        "name": 1,
        "platform": 2,
        "max_batch_size": 4,
        "input": 5,
        "output": 6,
        "instance_group": 7,
        "default_model_filename": 8,
        "cc_model_filenames": 9,
        "dynamic_batching": 11,
        "optimization": 12,
    }
    fields = ModelConfig.DESCRIPTOR.fields_by_name
    # model_config.proto: ModelOptimizationPolicy.execution_accelerators = 4, its gpu_execution_accelerator = 1,
    # an Accelerator's name = 1 and parameters = 2.
    accelerators = fields["optimization"].message_type.fields_by_name["execution_accelerators"]
    assert accelerators.number == 4
    accelerator = accelerators.message_type.fields_by_name["gpu_execution_accelerator"]
    assert accelerator.number == 1
    assert {f.name: f.number for f in accelerator.message_type.fields} == {"name": 1, "parameters": 2}
    assert {f.name: f.number for f in fields["input"].message_type.fields} == {
        "name": 1,
        "data_type": 2,
        "format": 3,
        "dims": 4,
        "reshape": 5,
    }
    assert {f.name: f.number for f in fields["output"].message_type.fields} == {
        "name": 1,
        "data_type": 2,
        "dims": 3,
        "reshape": 5,
    }
    assert numbers(ModelInstanceGroup) == {"name": 1, "count": 2, "gpus": 3, "kind": 4}
    assert {f.name: f.number for f in fields["dynamic_batching"].message_type.fields} == {
        "preferred_batch_size": 1,
        "max_queue_delay_microseconds": 2,
    }
    assert {v.name: v.number for v in ModelInstanceGroup.Kind.DESCRIPTOR.values} == {
        "KIND_AUTO": 0,
        "KIND_GPU": 1,
        "KIND_CPU": 2,
        "KIND_MODEL": 3,
    }
    entry = fields["cc_model_filenames"].message_type
    assert entry.GetOptions().map_entry and [f.name for f in entry.fields] == ["key", "value"]
    cfg = ModelConfig()
    cfg.cc_model_filenames["8.6"] = "model_sm86.plan"
    assert dict(cfg.cc_model_filenames) == {"8.6": "model_sm86.plan"}


# --------------------------------------------------------------------------- the default plan


def portable_engine(eid: int = 9) -> dict[str, Any]:
    return {
        "id": eid,
        "target": "tensorrt-rtx/portable",
        "backend": "tensorrt-rtx",
        "compute_capability": None,
        "compute_capabilities": ["8.0", "8.6", "8.9", "12.0", "12.1"],
        "sha256": "d" * 64,
        "precision": "fp16",
    }


def test_plans_of_sm86_and_sm120_only_have_no_default(tmp_path: Path) -> None:
    """Triton hands default_model_filename to every GPU missing from cc_model_filenames: an sm120 plan there would
    reach an A100 (8.0) or a T4 (7.5), where it cannot load."""
    model, onnx_path = model_of(conv_net(), tmp_path)
    result = write_repository(tmp_path / "repo", model, sample_spec(), plans(tmp_path, "8.6", "12.0"), onnx_path)
    cfg = load_config(tmp_path / "repo" / "net")
    assert not cfg.default_model_filename
    assert "default_model_filename" not in (tmp_path / "repo" / "net" / "config.pbtxt").read_text()
    assert dict(cfg.cc_model_filenames) == {"8.6": "model_sm86.plan", "12.0": "model_sm120.plan"}
    (warning,) = result.warnings
    assert "compute capability 8.6, 12.0 and on no other" in warning and "portable" in warning


def test_a_portable_engine_is_the_default_and_serves_the_ccs_it_covers(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    engines = plans(tmp_path, "8.6", "12.0", backend="tensorrt-rtx")
    wide = tmp_path / "downloads" / "portable.bin"
    wide.write_bytes(b"portable plan")
    engines["8.9"] = engines["8.0"] = (portable_engine(), wide)  # resolution picked it where nothing narrower runs
    result = write_repository(tmp_path / "repo", model, sample_spec(), engines, onnx_path)
    cfg = load_config(tmp_path / "repo" / "net")
    assert cfg.default_model_filename == "model_portable.plan"
    assert dict(cfg.cc_model_filenames) == {
        "8.0": "model_portable.plan",
        "8.6": "model_sm86.plan",
        "8.9": "model_portable.plan",
        "12.0": "model_sm120.plan",
    }
    vdir = tmp_path / "repo" / "net" / "1"
    assert sorted(p.name for p in vdir.iterdir()) == ["model_portable.plan", "model_sm120.plan", "model_sm86.plan"]
    assert (vdir / "model_portable.plan").read_bytes() == b"portable plan"
    assert not [w for w in result.warnings if w.startswith("no default_model_filename")]
    assert "default_model_filename is model_portable.plan, the portable TensorRT-RTX plan" in result.warnings[0]
    assert "compute capability 8.0, 8.6, 8.9, 12.0, 12.1" in result.warnings[0]


def test_an_ampere_plus_engine_is_the_default(tmp_path: Path) -> None:
    model, onnx_path = model_of(conv_net(), tmp_path)
    engines = plans(tmp_path, "8.0", "8.6")
    engines["8.0"][0]["hardware_compat"] = "ampere_plus"
    result = write_repository(tmp_path / "repo", model, sample_spec(), engines, onnx_path)
    cfg = load_config(tmp_path / "repo" / "net")
    assert cfg.default_model_filename == "model_sm80_ampere_plus.plan"
    assert "8.0 and newer (Ampere+" in result.warnings[0]
    assert dict(cfg.cc_model_filenames) == {"8.0": "model_sm80_ampere_plus.plan", "8.6": "model_sm86.plan"}


# --------------------------------------------------------------------------- output dims


def reshaped_decoder(hidden: int = 8) -> onnx.ModelProto:
    """x [batch, seq, hidden] → Reshape to [batch*seq, hidden] with the shape computed from Shape and Concat, as the
    TorchScript exporter writes it: the output's declared dims are names ("Reshapey_dim_1"), its hidden size fixed."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Constant", [], ["last"], value=helper.make_tensor("last", TensorProto.INT64, [1], [2])),
        helper.make_node("Gather", ["shape", "last"], ["h"], axis=0),
        helper.make_node("Constant", [], ["minus1"], value=helper.make_tensor("m", TensorProto.INT64, [1], [-1])),
        helper.make_node("Concat", ["minus1", "h"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["Reshapey_dim_0", "Reshapey_dim_1"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_output_dims_come_from_the_models_static_dims(tmp_path: Path) -> None:
    """The catalog records the hidden size the exporter left as a name, and the config carries it, not -1."""
    model, path = model_of(reshaped_decoder(hidden=8), tmp_path, "decoder")
    assert model["outputs"][0]["dims"] == ["Reshapey_dim_0", 8]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.zeros((2, 3, 8), np.float32)})[0].shape == (6, 8)
    cfg = parse(render_config(model, {"profiles": []}, name="m", platform="tensorrt_plan"))
    assert list(cfg.output[0].dims) == [-1, 8]


def test_output_dims_a_profile_fixes_by_name(tmp_path: Path) -> None:
    """An output dim named as an input dim every profile holds at one size has that size (a fixed sequence)."""
    model, _ = model_of(elementwise([("x", ["N", "seq", 4])], ["N", "seq", 4]), tmp_path)
    fixed = {"profiles": [profile(x=([1, 16, 4], [4, 16, 4], [8, 16, 4]))]}
    cfg = parse(render_config(model, fixed, name="m", platform="tensorrt_plan"))
    assert cfg.max_batch_size == 8 and list(cfg.output[0].dims) == [16, 4] and list(cfg.input[0].dims) == [16, 4]
    ranged = {"profiles": [profile(x=([1, 8, 4], [4, 16, 4], [8, 32, 4]))]}
    assert list(parse(render_config(model, ranged, name="m", platform="tensorrt_plan")).output[0].dims) == [-1, 4]


def test_plans_that_take_no_batch_of_1_are_warned_of(tmp_path: Path) -> None:
    """A plan built for batch 8 only (a fixed shape) gets max_batch_size 8, and Triton's dynamic batcher would send it
    smaller batches that fail: the export says so; a range from 1 gets no such warning."""
    model, _ = model_of(elementwise([("x", ["N", 4])], ["N", 4]), tmp_path)
    fixed = {"profiles": [profile(x=([8, 4], [8, 4], [8, 4]))]}
    _, warnings = config_spec(model, [fixed])
    assert batching_of(model, fixed) == 8
    assert [w for w in warnings if "batches of at least 8" in w and "--minShapes" in w], warnings
    ranged = {"profiles": [profile(x=([1, 4], [8, 4], [8, 4]))]}
    assert config_spec(model, [ranged]) == (ranged, [])
