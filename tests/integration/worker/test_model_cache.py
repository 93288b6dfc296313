"""The worker's per-sha256 model cache (worker.pipeline.model_file_from_store) after a worker was killed in it."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import onnx
import pytest

from enginefarm.core.config import Settings
from enginefarm.core.errors import NotFound
from enginefarm.graph.samples import conv_net
from storage.blobs import BlobStore, get_blob_store, model_key
from worker.pipeline import fetch_verified, model_file_from_store


def stored_model(tmp_path: Path, seed: int) -> tuple[Settings, BlobStore, bytes, str]:
    """A farm's settings, its local store and a conv net's bytes stored in it, with their sha256."""
    settings = Settings(data_dir=tmp_path / "farm")
    settings.ensure_dirs()
    data = conv_net(seed=seed).SerializeToString()
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "m.onnx").write_bytes(data)
    store = get_blob_store(settings)
    store.put_file(model_key(sha), tmp_path / "m.onnx", sha)
    return settings, store, data, sha


def test_a_pointer_file_cut_short_by_a_kill_is_not_read_as_the_current_directory(tmp_path):
    """Was broken: a worker killed while writing ``model.path`` left it empty; ``Path("")`` is ``.``, which
    exists, so every later build of that model on the host handed "." to the parser and failed."""
    settings, store, data, sha = stored_model(tmp_path, seed=5)
    first = model_file_from_store(store, model_key(sha), sha, "onnx", settings)
    (settings.work_dir / "models" / sha / "model.path").write_text("")  # what the kill left
    again = model_file_from_store(store, model_key(sha), sha, "onnx", settings)
    assert again == first and again.is_file()
    onnx.checker.check_model(onnx.load(str(again)))
    assert not list((settings.work_dir / "models" / sha).glob("*.partial"))


def test_a_local_stores_model_is_linked_into_the_cache_and_copied_across_file_systems(tmp_path):
    """The cache holds the local store's own file (one inode: no copy of a model that may be gigabytes, no second
    copy on disk); a cache on another file system (tmpfs here) gets a verified copy."""
    settings, store, data, sha = stored_model(tmp_path, seed=6)
    blob = store.local_path(model_key(sha))
    cached = model_file_from_store(store, model_key(sha), sha, "onnx", settings)
    assert os.stat(cached).st_ino == os.stat(blob).st_ino and cached.read_bytes() == data
    elsewhere = Path(tempfile.mkdtemp(dir="/dev/shm")) / "model.onnx"  # tmpfs: no hard link to the data disk
    try:
        fetch_verified(store, model_key(sha), sha, elsewhere)
        assert os.stat(elsewhere).st_ino != os.stat(blob).st_ino and elsewhere.read_bytes() == data
    finally:
        shutil.rmtree(elsewhere.parent)
    with pytest.raises(NotFound):
        fetch_verified(store, model_key("0" * 64), "0" * 64, tmp_path / "missing.onnx")
