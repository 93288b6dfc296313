"""The blob garbage collector on a local blob store and a SQLite catalog: what it deletes, what it never
deletes, and rows that commit while it runs."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from enginefarm.core.config import Settings
from storage import blobwrite, gc
from storage.blobs import engine_key, get_blob_store, model_key, samples_key
from storage.blobs.local import TMP_PREFIX, LocalBlobStore
from storage.db import migrate, session_scope
from storage.gc import GcRefused, collect_garbage
from storage.tables import Base, EngineRow, ModelRow

GRACE = 3600.0
OLD = 2 * 3600.0  # seconds: older than the grace period


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = Settings(data_dir=tmp_path / "farm")
    migrate(settings)
    return settings


@pytest.fixture
def store(settings) -> LocalBlobStore:
    store = get_blob_store(settings)
    assert isinstance(store, LocalBlobStore)
    return store


def age(path: Path, seconds: float) -> None:
    when = time.time() - seconds
    os.utime(path, (when, when))


def put(store: LocalBlobStore, data: bytes, key_of=model_key, *, old: bool = True) -> str:
    """Store ``data`` as the farm does (content-addressed); ``old`` backdates it past the grace period."""
    src = store.root.parent / f"src-{uuid.uuid4().hex}"
    src.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    key = key_of(sha)
    store.put_file(key, src, sha)
    src.unlink()
    if old:
        age(store.root / key, OLD)
    return key


def add_model(settings: Settings, key: str, samples: str | None = None) -> int:
    with session_scope(settings) as s:
        row = ModelRow(
            name=f"m-{uuid.uuid4().hex[:8]}",
            version="1",
            seq=1,
            sha256=key.rsplit("/", 1)[-1][:64],
            format="onnx",
            blob_key=key,
            size=1,
            info={},
            samples_key=samples,
            samples_sha256=samples.rsplit("/", 1)[-1] if samples else None,
        )
        s.add(row)
        s.flush()
        return row.id


def add_engine(settings: Settings, model_id: int, key: str) -> None:
    with session_scope(settings) as s:
        s.add(
            EngineRow(
                model_id=model_id,
                model_sha256="0" * 64,
                spec_hash=uuid.uuid4().hex,
                target="onnxruntime/cpu-x86_64",
                backend="onnxruntime",
                backend_version="1",
                precision="fp32",
                platform="x86_64",
                sha256=key.rsplit("/", 1)[-1],
                size=1,
                blob_key=key,
                build_seconds=0.1,
            )
        )


@pytest.fixture
def model(settings, store) -> str:
    """One catalogued model, so the catalog is not empty; returns its blob key."""
    key = put(store, b"the model")
    add_model(settings, key)
    return key


# --------------------------------------------------------------------------- the store's listing


def test_objects_lists_size_and_utc_mtime_but_not_temp_files(store, tmp_path):
    key = put(store, b"x" * 1234, old=False)
    other = put(store, b"engine", engine_key, old=False)
    (store.root / key).parent.joinpath(f"{TMP_PREFIX}abc").write_bytes(b"half")
    before = datetime.now(timezone.utc)
    age(store.root / key, 60)

    listed = {o.key: o for o in store.objects()}
    assert set(listed) == {key, other}
    assert listed[key].size == 1234
    assert listed[key].modified.tzinfo is not None and listed[key].modified.utcoffset() == timedelta(0)
    assert abs((before - listed[key].modified).total_seconds() - 60) < 5
    assert [o.key for o in store.objects("engines/")] == [other]
    assert list(store.objects("samples/")) == []
    assert store.stat(key) == listed[key]
    assert store.stat(model_key("f" * 64)) is None
    assert [p.key for p in store.partial_uploads()] == [f"{key.rsplit('/', 1)[0]}/{TMP_PREFIX}abc"]


def test_put_of_bytes_already_stored_refreshes_the_modified_time(store):
    key = put(store, b"orphan bytes")
    assert (datetime.now(timezone.utc) - store.stat(key).modified).total_seconds() > GRACE
    put(store, b"orphan bytes", old=False)  # the same content again: nothing copied, but it is young now
    assert (datetime.now(timezone.utc) - store.stat(key).modified).total_seconds() < 60


# --------------------------------------------------------------------------- what is deleted, what is kept


def test_old_orphans_are_deleted_and_their_bytes_counted(settings, store, model):
    orphan_model = put(store, b"m" * 5000)
    orphan_engine = put(store, b"e" * 3000, engine_key)

    report = collect_garbage(settings, grace_seconds=GRACE)

    assert sorted(report.deleted) == sorted([orphan_model, orphan_engine])
    assert report.deleted_bytes == 8000
    assert (report.scanned, report.referenced, report.kept_young, report.errors) == (3, 1, [], [])
    assert not store.exists(orphan_model) and not store.exists(orphan_engine)
    assert store.exists(model)
    # Idempotent: a second sweep finds nothing more to do.
    again = collect_garbage(settings, grace_seconds=GRACE)
    assert (again.scanned, again.deleted, again.errors) == (1, [], [])


def test_young_orphan_is_kept_until_the_grace_period_ends(settings, store, model):
    young = put(store, b"just uploaded", old=False)

    report = collect_garbage(settings, grace_seconds=GRACE)
    assert report.kept_young == [young] and report.deleted == []
    assert store.exists(young)

    later = datetime.now(timezone.utc) + timedelta(seconds=GRACE + 60)
    report = collect_garbage(settings, grace_seconds=GRACE, now=later)
    assert report.deleted == [young] and not store.exists(young)


def test_referenced_model_engine_and_samples_blobs_are_never_deleted(settings, store):
    model = put(store, b"model bytes")
    samples = put(store, b"samples bytes", samples_key)
    engine = put(store, b"engine bytes", engine_key)
    orphan = put(store, b"orphan")
    model_id = add_model(settings, model, samples)
    add_engine(settings, model_id, engine)
    for key in (model, samples, engine):
        age(store.root / key, 10 * 24 * 3600)

    report = collect_garbage(settings, grace_seconds=0)

    assert report.deleted == [orphan]
    assert report.referenced == 3 and report.missing == []
    for key in (model, samples, engine):
        assert store.exists(key), key


def test_dry_run_deletes_nothing_but_reports_what_it_would(settings, store, model):
    orphan = put(store, b"o" * 777)
    temp = store.root / "engines" / "ab" / f"{TMP_PREFIX}crashed"
    temp.parent.mkdir(parents=True)
    temp.write_bytes(b"t" * 100)
    age(temp, OLD)

    report = collect_garbage(settings, grace_seconds=GRACE, dry_run=True)

    assert report.dry_run and report.deleted == [orphan] and report.deleted_bytes == 777
    assert report.partials_deleted == [f"engines/ab/{TMP_PREFIX}crashed"] and report.partials_bytes == 100
    assert store.exists(orphan) and temp.exists()


def test_stale_temp_files_of_interrupted_writes_are_removed_fresh_ones_kept(settings, store, model):
    folder = store.root / "models" / "cd"
    folder.mkdir(parents=True)
    stale, live = folder / f"{TMP_PREFIX}stale", folder / f"{TMP_PREFIX}live"
    stale.write_bytes(b"s" * 50)
    live.write_bytes(b"l" * 10)
    age(stale, OLD)

    report = collect_garbage(settings, grace_seconds=GRACE)

    assert report.partials_deleted == [f"models/cd/{TMP_PREFIX}stale"] and report.partials_bytes == 50
    assert not stale.exists() and live.exists()
    assert report.deleted == []  # a temp file is never counted as a blob


def test_objects_outside_the_farms_prefixes_are_left_alone(settings, store, model):
    foreign = store.root / "backups" / "catalog.sql"
    foreign.parent.mkdir()
    foreign.write_bytes(b"not ours")
    age(foreign, OLD)

    report = collect_garbage(settings, grace_seconds=0)
    assert report.scanned == 1 and report.deleted == []
    assert foreign.exists()


def test_a_catalog_that_references_nothing_is_refused(settings, store):
    orphan = put(store, b"maybe the wrong database")
    with pytest.raises(GcRefused, match="references no blob"):
        collect_garbage(settings, grace_seconds=GRACE)
    assert store.exists(orphan)
    report = collect_garbage(settings, grace_seconds=GRACE, allow_empty_catalog=True)
    assert report.deleted == [orphan] and not store.exists(orphan)


def test_a_referenced_blob_missing_from_the_store_is_reported(settings, store, model):
    lost = model_key("e" * 64)
    add_model(settings, lost)
    report = collect_garbage(settings, grace_seconds=GRACE)
    assert report.missing == [lost] and report.referenced == 1


def test_one_failing_delete_does_not_stop_the_sweep(settings, store, model, monkeypatch):
    bad, good = put(store, b"bad"), put(store, b"good")
    real_delete = store.delete

    def delete(key: str) -> None:
        if key == bad:
            raise OSError("disk says no")
        real_delete(key)

    monkeypatch.setattr(store, "delete", delete)
    report = collect_garbage(settings, grace_seconds=GRACE, store=store)
    assert report.deleted == [good] and not store.exists(good)
    assert report.errors == [f"{bad}: disk says no"] and store.exists(bad)


# --------------------------------------------------------------------------- rows that commit during the sweep


def test_row_committed_after_the_listing_keeps_its_blob(settings, store, model, monkeypatch):
    """The upload stored its blob before the sweep listed it, and commits its row right after the listing."""
    pending = put(store, b"upload in flight")
    real_objects = store.objects

    def objects(prefix: str = ""):
        yield from real_objects(prefix)
        if prefix == gc.MANAGED_PREFIXES[-1]:  # the listing is complete: the upload's row commits now
            add_model(settings, pending)

    monkeypatch.setattr(store, "objects", objects)
    report = collect_garbage(settings, grace_seconds=0, store=store)
    assert store.exists(pending)
    assert report.deleted == [] and report.referenced == 2


def test_row_committed_after_the_referenced_keys_were_read_keeps_its_blob(settings, store, model, monkeypatch):
    """The row commits between the read of the referenced set and the delete: the last look catches it."""
    pending = put(store, b"upload in flight")
    real = gc.referenced_keys

    def referenced_keys(session):
        keys = real(session)
        add_model(settings, pending)  # another transaction commits after the read
        return keys

    monkeypatch.setattr(gc, "referenced_keys", referenced_keys)
    report = collect_garbage(settings, grace_seconds=GRACE)
    assert store.exists(pending)
    assert report.deleted == [] and report.referenced == 2


def test_old_orphan_reused_by_a_new_upload_during_the_sweep_is_kept(settings, store, model, monkeypatch):
    """Content addressing: a new upload of the same bytes finds the old orphan and only refreshes it;
    its row will commit after the sweep. The refresh, seen by the last look at the object, keeps it."""
    orphan = put(store, b"same bytes again")
    real = gc.referenced_keys

    def referenced_keys(session):
        keys = real(session)
        put(store, b"same bytes again", old=False)  # the new upload's put_file, after the listing
        return keys

    monkeypatch.setattr(gc, "referenced_keys", referenced_keys)
    report = collect_garbage(settings, grace_seconds=GRACE)
    assert store.exists(orphan)
    assert report.deleted == [] and report.kept_young == [orphan]


def test_blob_deleted_by_another_sweep_meanwhile_is_no_error(settings, store, model, monkeypatch):
    orphan = put(store, b"raced")
    real = gc.referenced_keys

    def referenced_keys(session):
        keys = real(session)
        store.delete(orphan)  # a concurrent sweep got there first
        return keys

    monkeypatch.setattr(gc, "referenced_keys", referenced_keys)
    report = collect_garbage(settings, grace_seconds=GRACE)
    assert (report.deleted, report.vanished, report.errors) == ([], 1, [])


# --------------------------------------------------------------------------- the catalog's blob columns


def test_every_blob_key_column_of_the_catalog_counts_as_a_reference():
    """A new column holding a blob key must be added to REFERENCE_COLUMNS, or its blobs would be collected."""
    not_blob_keys = {"benchmarks.shape_key", "engines.kind_key"}
    key_columns = {
        f"{table.name}.{column.name}"
        for table in Base.metadata.tables.values()
        for column in table.columns
        if column.name.endswith("_key")
    }
    assert key_columns - not_blob_keys == {f"{c.class_.__tablename__}.{c.key}" for c in blobwrite.REFERENCE_COLUMNS}
