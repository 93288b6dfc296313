"""Blob and row written together (storage.blobwrite) under interleavings that used to lose bytes: a writer
that fails while another writer of the same bytes is between storing the blob and committing its row.

Both catalogs: SQLite (file locks, the embedded farm) and PostgreSQL (advisory locks), each with a local
blob store; the lock is the catalog's, not the store's.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from enginefarm.core.errors import Conflict
from storage.blobs import get_blob_store, model_key
from storage.blobwrite import give_up_if_unreferenced, store_with_row
from storage.db import session_scope
from storage.tables import ModelRow


def _blob(tmp_path: Path) -> tuple[Path, str, str]:
    data = uuid.uuid4().bytes * 1000
    path = tmp_path / f"src-{uuid.uuid4().hex}"
    path.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    return path, sha, model_key(sha)


def _row(session, sha: str, key: str) -> int:
    row = ModelRow(
        name=f"m-{uuid.uuid4().hex[:8]}", version="1", seq=1, sha256=sha, format="onnx", blob_key=key, size=1, info={}
    )
    session.add(row)
    session.flush()
    return row.id


def test_a_failed_writer_never_deletes_the_bytes_of_a_writer_about_to_commit(settings, tmp_path):
    """Was data loss: the winner stored the blob and was about to commit its row; the loser, whose own row
    failed, saw no committed row yet and deleted the blob the winner's row then pointed at."""
    store = get_blob_store(settings)
    path, sha, key = _blob(tmp_path)
    winner_stored = threading.Event()

    def winner(session) -> int:
        winner_stored.set()
        time.sleep(1.0)  # the loser runs now, if nothing holds it back
        return _row(session, sha, key)

    def loser(session) -> int:
        raise Conflict("this upload lost")

    with ThreadPoolExecutor(2) as pool:
        won = pool.submit(store_with_row, settings, store, key, path, sha, winner)
        assert winner_stored.wait(10)
        lost = pool.submit(store_with_row, settings, store, key, path, sha, loser)
        with pytest.raises(Conflict):
            lost.result(30)
        row_id = won.result(30)
    assert store.exists(key), "the loser deleted the blob the winner's row points at"
    with session_scope(settings) as s:
        assert s.get(ModelRow, row_id).blob_key == key


def test_a_failed_write_leaves_nothing_and_a_superseded_one_leaves_nothing(settings, tmp_path):
    store = get_blob_store(settings)
    path, sha, key = _blob(tmp_path)

    def fails(session) -> None:
        raise Conflict("no row for these bytes")

    with pytest.raises(Conflict):
        store_with_row(settings, store, key, path, sha, fails)
    assert not store.exists(key)
    # A write that commits but whose row points elsewhere (another task catalogued the engine first).
    assert store_with_row(settings, store, key, path, sha, lambda session: "no row") == "no row"
    assert not store.exists(key)


def test_storing_again_restores_a_blob_gone_from_under_its_row(settings, tmp_path):
    store = get_blob_store(settings)
    path, sha, key = _blob(tmp_path)
    row_id = store_with_row(settings, store, key, path, sha, lambda s: _row(s, sha, key))
    store.delete(key)
    assert store_with_row(settings, store, key, path, sha, lambda s: s.get(ModelRow, row_id).id) == row_id
    assert store.exists(key)


def test_give_up_keeps_a_referenced_blob(settings, tmp_path):
    store = get_blob_store(settings)
    path, sha, key = _blob(tmp_path)
    store_with_row(settings, store, key, path, sha, lambda s: _row(s, sha, key))
    assert give_up_if_unreferenced(settings, store, key) is False and store.exists(key)


def test_many_writers_of_one_key_end_with_their_rows_and_the_blob(settings, tmp_path):
    """Eight writers of the same bytes at once, half of them failing: every committed row's blob exists."""
    store = get_blob_store(settings)
    path, sha, key = _blob(tmp_path)

    def write(i: int) -> int | None:
        def block(session) -> int:
            if i % 2:
                raise Conflict(f"writer {i} fails")
            return _row(session, sha, key)

        try:
            return store_with_row(settings, store, key, path, sha, block)
        except Conflict:
            return None

    with ThreadPoolExecutor(8) as pool:
        rows = [r for r in pool.map(write, range(8)) if r is not None]
    assert len(rows) == 4 and store.exists(key)
    assert store.size(key) == path.stat().st_size
