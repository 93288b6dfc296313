"""The worker's per-sha256 model cache (worker.pipeline.model_file_from_store) after a worker was killed in it."""

from __future__ import annotations

import hashlib

import onnx

from enginefarm.core.config import Settings
from enginefarm.graph.samples import conv_net
from enginefarm.storage.blobs import get_blob_store, model_key
from enginefarm.worker.pipeline import model_file_from_store


def test_a_pointer_file_cut_short_by_a_kill_is_not_read_as_the_current_directory(tmp_path):
    """Was broken: a worker killed while writing ``model.path`` left it empty; ``Path("")`` is ``.``, which
    exists, so every later build of that model on the host handed "." to the parser and failed."""
    settings = Settings(data_dir=tmp_path / "farm")
    settings.ensure_dirs()
    data = conv_net(seed=5).SerializeToString()
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "m.onnx").write_bytes(data)
    store = get_blob_store(settings)
    store.put_file(model_key(sha), tmp_path / "m.onnx", sha)
    first = model_file_from_store(store, model_key(sha), sha, "onnx", settings)
    (settings.work_dir / "models" / sha / "model.path").write_text("")  # what the kill left
    again = model_file_from_store(store, model_key(sha), sha, "onnx", settings)
    assert again == first and again.is_file()
    onnx.checker.check_model(onnx.load(str(again)))
    assert not list((settings.work_dir / "models" / sha).glob("*.partial"))
