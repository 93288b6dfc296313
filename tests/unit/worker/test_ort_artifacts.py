"""The ONNX Runtime artifact is one self-contained .onnx file that loads from its own bytes: a model whose weights
sit in external data files (a bundle's weights.bin) has them moved into the artifact, and an artifact that does
not load alone is refused before it could be stored."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from enginefarm.core.domain import Target
from enginefarm.core.errors import BuildFailed
from enginefarm.core.spec import BuildSpec
from enginefarm.graph.samples import conv_net, sample_spec
from tests.unloadable_backend import point_outside
from worker.backends import BuildLog
from worker.backends import onnxruntime as ort_backend
from worker.pipeline import engine_from_model

ORT = Target.parse("onnxruntime/cpu-x86_64")


def external_model(folder: Path) -> Path:
    """model.onnx with every weight in weights.bin beside it, as a bundle unpacks."""
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    onnx.save_model(
        conv_net(seed=131),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return path


def alone(artifact: Path, folder: Path) -> Path:
    """The artifact's bytes in a fresh folder with nothing beside them, as a deploy machine downloads them."""
    folder.mkdir()
    return Path(shutil.copyfile(artifact, folder / "model.onnx"))


def run(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


@pytest.mark.parametrize(("precision", "cleanup"), [("fp32", "none"), ("fp16", "none"), ("fp32", "onnxslim")])
def test_external_data_model_builds_one_self_contained_file(tmp_path, precision, cleanup):
    """As the bundle's model.onnx (fp32), through the fp16 graph, and through onnxslim's prepared graph."""
    model = external_model(tmp_path / "bundle")
    log = BuildLog()
    (tmp_path / "scratch").mkdir()
    spec = BuildSpec(**sample_spec(), precision=precision, graph_cleanup=cleanup)
    built = engine_from_model(model, spec, ORT, None, tmp_path / "scratch", log)
    optimized = onnx.load(str(built.path), load_external_data=False)
    assert not [t.name for t in optimized.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    got = run(alone(built.path, tmp_path / "deploy"), x)
    np.testing.assert_allclose(got, run(model, x), atol=1e-5 if precision == "fp32" else 2e-2, rtol=1e-3)


def test_an_artifact_reading_files_it_does_not_carry_is_refused(tmp_path):
    model = external_model(tmp_path / "bundle")
    (tmp_path / "scratch").mkdir()
    built = engine_from_model(model, BuildSpec(**sample_spec()), ORT, None, tmp_path / "scratch", BuildLog())
    point_outside(built.path)
    with pytest.raises(
        BuildFailed,
        match="does not load from its own bytes: .*read external data files it does not carry; it was not stored",
    ):
        ort_backend.check_loadable(built.path)


def test_bytes_that_are_no_model_are_refused(tmp_path):
    junk = tmp_path / "engine.plan"
    junk.write_bytes(b"\x08\x07" + bytes(64))
    with pytest.raises(BuildFailed, match="does not load from its own bytes"):
        ort_backend.check_loadable(junk)


def test_a_model_over_what_one_onnx_file_holds_is_refused_naming_the_limit(tmp_path, monkeypatch):
    """Past protobuf's 2 GiB the weights cannot move into one file: the build fails saying so. The limit is lowered
    here to this model's size rather than writing 2 GiB."""
    model = external_model(tmp_path / "bundle")
    monkeypatch.setattr(ort_backend, "INLINE_LIMIT", 4096)
    (tmp_path / "scratch").mkdir()
    with pytest.raises(BuildFailed, match=r"over the 4096 bytes one \.onnx file can hold \(protobuf's 2 GiB limit\)"):
        engine_from_model(model, BuildSpec(**sample_spec()), ORT, None, tmp_path / "scratch", BuildLog())
