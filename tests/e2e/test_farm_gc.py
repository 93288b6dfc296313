"""The blob garbage collector against the real farm: PostgreSQL catalog, SeaweedFS S3, real workers.

The sweeps here use a grace period of 0, which is only safe while no write is between storing its blob
and committing its row. The tests run one at a time, so no upload is in flight; builds of earlier tests
may still be, so each sweep first waits until no build or quantization can be writing a blob.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from sqlalchemy import select

from enginefarm.client import Client
from enginefarm.core.domain import TaskState
from enginefarm.graph.samples import sample_spec, save_conv_net
from storage import liveness
from storage.blobs import engine_key, get_blob_store, model_key
from storage.blobs.base import PartialUpload
from storage.blobs.s3 import S3BlobStore
from storage.db import session_scope
from storage.gc import collect_garbage, referenced_keys
from storage.tables import BuildRow, BuildTaskRow, EngineRow, ModelRow, ReferenceRow
from tests.helpers import unique_name

TARGETS = ["onnxruntime/cpu-x86_64", "tensorrt-rtx/sm86"]
BUSY = (TaskState.QUEUED.value, TaskState.RUNNING.value)


@pytest.fixture(scope="module")
def catalogued(farm, tmp_path_factory) -> dict:
    """A model with samples and engines built by the workers: blobs of every kind the catalog points at."""
    tmp = tmp_path_factory.mktemp("gc")
    path = save_conv_net(tmp / "m.onnx", seed=41)
    np.savez(tmp / "samples.npz", input=np.random.default_rng(41).standard_normal((4, 3, 32, 32)).astype(np.float32))
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("gc"))
        model = c.upload_samples(model["id"], tmp / "samples.npz")
        build = c.wait_build(c.build(model["id"], TARGETS, sample_spec())["id"], timeout=300, poll=0.2)
    assert {t["state"] for t in build["tasks"]} == {"succeeded"}, build["tasks"]
    return model


@pytest.fixture
def store(dist_settings) -> S3BlobStore:
    store = get_blob_store(dist_settings)
    assert isinstance(store, S3BlobStore)
    return store


def wait_until_no_blob_writes(settings, timeout: float = 120) -> None:
    """Wait until no build task can be storing an engine and no quantization a model. A queued task for a
    target no live worker serves never starts, so it does not count."""
    deadline = time.monotonic() + timeout
    while True:
        with session_scope(settings) as s:
            served = liveness.served_targets(s, settings.worker_ttl_seconds)
            busy = [
                t.id
                for t in s.scalars(select(BuildTaskRow).where(BuildTaskRow.state.in_(BUSY)))
                if t.state == TaskState.RUNNING.value or t.target in served
            ]
            busy += [
                b.id
                for b in s.scalars(select(BuildRow).where(BuildRow.quantize.is_not(None)))
                if (b.quantize or {}).get("state") in BUSY
            ]
        if not busy:
            return
        assert time.monotonic() < deadline, f"builds still writing blobs after {timeout} s: {busy}"
        time.sleep(0.5)


def put_orphan(store: S3BlobStore, key_of=model_key, size: int = 4096) -> tuple[str, int]:
    """An object no row points at, written straight into the bucket (what an interrupted upload leaves)."""
    data = os.urandom(size)
    key = key_of(hashlib.sha256(data).hexdigest())
    store.client.put_object(Bucket=store.bucket, Key=key, Body=data)
    return key, size


def sha256_of(store: S3BlobStore, key: str) -> str:
    digest = hashlib.sha256()
    for chunk in store.iter_chunks(key):
        digest.update(chunk)
    return digest.hexdigest()


def test_sweep_deletes_orphans_and_keeps_every_catalogued_blob_intact(farm, dist_settings, catalogued, store, tmp_path):
    orphans = [put_orphan(store), put_orphan(store, engine_key, 1000)]
    wait_until_no_blob_writes(dist_settings)
    time.sleep(1.1)  # LastModified has whole seconds: let the orphans be strictly older than now

    report = collect_garbage(dist_settings, grace_seconds=0)

    assert report.errors == [] and report.missing == []
    for key, _ in orphans:
        assert key in report.deleted
        assert not store.exists(key)
    assert report.deleted_bytes >= sum(size for _, size in orphans)
    # Every blob the catalog points at is still there, byte for byte what the catalog says.
    with session_scope(dist_settings) as s:
        rows = [(m.blob_key, m.sha256) for m in s.scalars(select(ModelRow))]
        rows += [(m.samples_key, m.samples_sha256) for m in s.scalars(select(ModelRow)) if m.samples_key]
        rows += [(e.blob_key, e.sha256) for e in s.scalars(select(EngineRow))]
        rows += [(r.blob_key, r.sha256) for r in s.scalars(select(ReferenceRow))]
        assert {key for key, _ in rows} == referenced_keys(s)
    assert report.referenced == len({key for key, _ in rows})
    kinds = {key.split("/")[0] for key, _ in rows}
    assert kinds == {"models", "samples", "engines", "references"}, kinds
    for key, sha in rows:
        assert sha256_of(store, key) == sha, key
    # The farm still serves what the sweep kept.
    with Client(farm.url) as c:
        engine = c.engines(model=catalogued["name"], target=TARGETS[0])["items"][0]
        assert c.download(engine["id"], tmp_path / "engine.bin", engine["sha256"]) == engine["sha256"]


def test_young_orphan_is_kept_within_the_grace_period(dist_settings, catalogued, store):
    young, _ = put_orphan(store)
    try:
        report = collect_garbage(dist_settings, grace_seconds=3600)
        assert young in report.kept_young and young not in report.deleted
        assert store.exists(young)
    finally:
        store.delete(young)  # leave the bucket as the other tests expect it: catalogued objects only


def test_storing_bytes_already_there_makes_the_object_young_again(dist_settings, catalogued, store, tmp_path):
    """A new upload of bytes an old orphan already holds copies nothing; S3 must still restart its grace period."""
    data = os.urandom(2048)
    sha = hashlib.sha256(data).hexdigest()
    key = model_key(sha)
    store.client.put_object(Bucket=store.bucket, Key=key, Body=data, Metadata={"sha256": sha})
    first = store.stat(key).modified
    try:
        time.sleep(1.5)  # LastModified has whole seconds
        (tmp_path / "again.bin").write_bytes(data)
        store.put_file(key, tmp_path / "again.bin", sha)
        refreshed = store.stat(key)
        assert refreshed.modified > first and refreshed.size == len(data)
        assert sha256_of(store, key) == sha

        # A sweep whose cutoff falls between the first write and the refresh keeps it.
        wait_until_no_blob_writes(dist_settings)
        report = collect_garbage(dist_settings, grace_seconds=0, now=first + timedelta(seconds=0.5))
        assert key in report.kept_young and store.exists(key)
    finally:
        store.delete(key)


def test_stale_multipart_upload_is_aborted(dist_settings, catalogued, store):
    """What a process killed halfway through a big upload leaves: parts, invisible to listings, still stored."""
    key = engine_key(uuid.uuid4().hex * 2)
    upload_id = store.client.create_multipart_upload(Bucket=store.bucket, Key=key)["UploadId"]
    store.client.upload_part(Bucket=store.bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"p" * 1234)

    def open_uploads() -> set[str]:
        return {u["UploadId"] for u in store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])}

    try:
        kept = collect_garbage(dist_settings, grace_seconds=3600)
        assert key not in kept.partials_deleted and upload_id in open_uploads()

        wait_until_no_blob_writes(dist_settings)
        time.sleep(1.1)  # LastModified has whole seconds
        report = collect_garbage(dist_settings, grace_seconds=0)
        assert key in report.partials_deleted and report.partials_bytes >= 1234
        assert upload_id not in open_uploads()
        assert not store.exists(key)
    finally:
        store.discard_partial(PartialUpload(key, 0, datetime.now(timezone.utc), upload_id))


def test_cli_gc_dry_run_then_sweep(farm, dist_settings, catalogued, store):
    import json
    import subprocess
    import sys

    orphan, size = put_orphan(store)
    time.sleep(1.1)
    wait_until_no_blob_writes(dist_settings)

    def gc(*args: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-m", "enginefarm", "gc", "--json", *args],
            env=farm.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    dry = gc("--dry-run", "--grace-hours", "0")
    assert dry["dry_run"] and orphan in dry["deleted"] and store.exists(orphan)
    assert gc()["deleted"] == [] and store.exists(orphan)  # the default grace (24 h) keeps a fresh orphan
    swept = gc("--grace-hours", "0")
    assert orphan in swept["deleted"] and not store.exists(orphan) and swept["deleted_bytes"] >= size
    with session_scope(dist_settings) as s:
        assert referenced_keys(s) <= {o.key for o in store.objects()}


def test_the_api_sweeps_periodically(farm, dist_settings, catalogued, store, tmp_path):
    """A second API process with a 1 s sweep and no grace: the orphan goes by itself, the catalogued blobs stay.
    Background work runs in one API process of the farm at a time (storage.leader): the session's API holds it,
    so the test ends that API's hold (its lock's connection, as a crashed host would) and the sweeper, asking
    five times as often, takes the job over."""
    from server.embedded import Farm

    orphan, _ = put_orphan(store)
    wait_until_no_blob_writes(dist_settings)
    env = {
        **farm.env,
        "ENGINEFARM_GC_INTERVAL_SECONDS": "1",
        "ENGINEFARM_GC_GRACE_SECONDS": "0",
        "ENGINEFARM_RECONCILE_SECONDS": "0.2",
    }
    with Farm(env, log_dir=tmp_path) as sweeper:
        sweeper.start_api()
        end_hold(dist_settings, "reconciler")
        deadline = time.monotonic() + 30
        while store.exists(orphan) and time.monotonic() < deadline:
            time.sleep(0.5)
    assert not store.exists(orphan)
    with session_scope(dist_settings) as s:
        assert referenced_keys(s) <= {o.key for o in store.objects()}


def end_hold(settings, job: str) -> None:
    """Terminate the connection that holds ``job``'s advisory lock (storage.leader), if one does."""
    from sqlalchemy import text

    from storage.db import advisory_key, get_engine

    key = advisory_key("job", job) & 0xFFFFFFFFFFFFFFFF
    with get_engine(settings).connect() as conn:
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND classid = :hi AND objid = :lo AND objsubid = 1"
            ),
            {"hi": key >> 32, "lo": key & 0xFFFFFFFF},
        )
