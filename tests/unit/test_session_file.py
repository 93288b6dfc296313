"""The file fetch writes beside an onnxruntime/cuda artifact: the provider options its GPU worker measured fastest.
Its name comes from the fetched file's, only known options with "0"/"1" go in, and one left by an earlier fetch of an
engine that now runs best on the defaults is removed."""

from __future__ import annotations

import json

from enginefarm.client.artifacts import session_file, write_session_file

CUDA = {"id": 4, "sha256": "ab" * 32, "target": "onnxruntime/cuda-sm90"}


def test_the_options_are_written_beside_the_file_and_only_known_ones(tmp_path):
    artifact = tmp_path / "net.onnx"
    engine = {**CUDA, "run_options": {"prefer_nhwc": "1", "enable_cuda_graph": "2", "../x": "1", "gpu_mem_limit": "1"}}
    written = write_session_file(engine, artifact)
    assert written == tmp_path / "net.onnx.session.json" == session_file(artifact)
    record = json.loads(written.read_text())
    assert record["provider_options"] == {"prefer_nhwc": "1"}
    assert record["provider"] == "CUDAExecutionProvider" and record["engine"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.onnx.session.json"]


def test_an_engine_on_the_defaults_removes_an_earlier_file_and_other_targets_write_none(tmp_path):
    artifact = tmp_path / "net.onnx"
    write_session_file({**CUDA, "run_options": {"enable_cuda_graph": "1"}}, artifact)
    assert session_file(artifact).is_file()
    assert write_session_file({**CUDA, "run_options": {}}, artifact) is None
    assert not session_file(artifact).exists()
    plan = tmp_path / "net.plan"
    assert write_session_file({"target": "tensorrt-rtx/sm86", "run_options": {"prefer_nhwc": "1"}}, plan) is None
    assert list(tmp_path.iterdir()) == []


def test_a_symbolic_link_in_its_place_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (tmp_path / "out").mkdir()
    artifact = tmp_path / "out" / "net.onnx"
    session_file(artifact).symlink_to(outside)
    write_session_file({**CUDA, "run_options": {"prefer_nhwc": "1"}}, artifact)
    assert outside.read_text() == "keep"
    assert not session_file(artifact).is_symlink()
    assert json.loads(session_file(artifact).read_text())["provider_options"] == {"prefer_nhwc": "1"}
