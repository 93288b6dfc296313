"""Blob stores: the same contract checked on a local directory and on a real SeaweedFS S3 server."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from pathlib import Path

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from enginefarm.core.config import Settings
from enginefarm.core.errors import InfrastructureError, IntegrityError, NotFound
from enginefarm.core.hashing import sha256_file
from server import localservers
from storage.blobs import engine_key, get_blob_store, model_key
from storage.blobs import s3 as s3_module
from storage.blobs.local import LocalBlobStore
from storage.blobs.s3 import S3BlobStore


def s3_settings(endpoint: str, bucket: str | None = None) -> Settings:
    return Settings(
        blob_store="s3",
        s3_endpoint_url=endpoint,
        s3_bucket=bucket or f"blobs-{uuid.uuid4().hex[:10]}",
        s3_access_key=localservers.S3_KEY,
        s3_secret_key=localservers.S3_SECRET,
    )


@pytest.fixture(scope="module")
def s3_bucket(seaweedfs):
    """One bucket for the module: SeaweedFS gives every bucket its own volumes, and has a fixed number."""
    settings = s3_settings(seaweedfs)
    store = S3BlobStore.from_settings(settings)  # creates the bucket
    yield settings
    _empty(store)
    store.client.delete_bucket(Bucket=store.bucket)


def _empty(store: S3BlobStore) -> None:
    for key in list(store.keys()):
        store.delete(key)


@pytest.fixture
def s3_store(s3_bucket) -> S3BlobStore:
    """The module's bucket, emptied for each test."""
    store = S3BlobStore.from_settings(s3_bucket)
    _empty(store)
    return store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    return request.getfixturevalue("s3_store")


def blob(tmp_path: Path, data: bytes, name: str = "src.bin") -> tuple[Path, str]:
    path = tmp_path / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.rglob(".incoming-*"))


# --------------------------------------------------------------------------- the shared contract


def test_put_then_get_round_trips(store, tmp_path):
    data = os.urandom(300_000)
    src, sha = blob(tmp_path, data)
    key = model_key(sha)
    assert not store.exists(key)
    store.put_file(key, src, sha)
    assert store.exists(key) and store.size(key) == len(data)
    dest = tmp_path / "out" / "copy.bin"
    store.get_file(key, dest)
    assert dest.read_bytes() == data
    assert sha256_file(dest) == sha
    assert leftovers(tmp_path) == []


def test_get_file_replaces_existing_dest(store, tmp_path):
    src, sha = blob(tmp_path, b"fresh bytes")
    store.put_file(engine_key(sha), src, sha)
    dest = tmp_path / "dest.bin"
    dest.write_bytes(b"stale and longer content")
    store.get_file(engine_key(sha), dest)
    assert dest.read_bytes() == b"fresh bytes"


def test_put_is_idempotent(store, tmp_path):
    src, sha = blob(tmp_path, b"engine bytes " * 1000)
    key = engine_key(sha)
    store.put_file(key, src, sha)
    store.put_file(key, src, sha)
    copy, _ = blob(tmp_path, b"engine bytes " * 1000, "copy.bin")
    store.put_file(key, copy, sha)
    assert list(store.keys("engines/")) == [key]
    dest = tmp_path / "out.bin"
    store.get_file(key, dest)
    assert dest.read_bytes() == src.read_bytes()


def test_put_with_wrong_sha256_raises_and_stores_nothing(store, tmp_path):
    src, sha = blob(tmp_path, b"the real bytes")
    wrong = hashlib.sha256(b"other bytes").hexdigest()
    key = model_key(wrong)
    with pytest.raises(IntegrityError, match=wrong):
        store.put_file(key, src, wrong)
    assert not store.exists(key)
    assert list(store.keys()) == []
    with pytest.raises(NotFound):
        store.get_file(key, tmp_path / "never.bin")
    assert not (tmp_path / "never.bin").exists()
    assert leftovers(tmp_path) == []  # no temp file left beside the blob or the destination


def test_put_with_wrong_sha256_over_an_existing_blob_raises(store, tmp_path):
    """An existing object of the same size is no proof: put returns only when the stored bytes match the claim."""
    src, sha = blob(tmp_path, b"AAAA")
    key = "models/fixed-key"
    store.put_file(key, src, sha)
    wrong = hashlib.sha256(b"BBBB").hexdigest()
    with pytest.raises(IntegrityError, match=wrong):
        store.put_file(key, src, wrong)
    dest = tmp_path / "out.bin"
    store.get_file(key, dest)
    assert dest.read_bytes() == b"AAAA"  # the verified blob is untouched
    assert leftovers(tmp_path) == []


def test_put_over_a_verified_blob_keeps_it(store, tmp_path):
    """Content addressing: a key whose stored bytes already match the sha256 is not rewritten."""
    src, sha = blob(tmp_path, b"AAAA")
    other, _ = blob(tmp_path, b"BBBB", "other.bin")
    store.put_file(model_key(sha), src, sha)
    store.put_file(model_key(sha), other, sha)
    dest = tmp_path / "out.bin"
    store.get_file(model_key(sha), dest)
    assert dest.read_bytes() == b"AAAA"


def test_get_missing_key_is_not_found(store, tmp_path):
    dest = tmp_path / "dest.bin"
    with pytest.raises(NotFound, match="missing"):
        store.get_file(model_key("0" * 64), dest)
    assert not dest.exists()
    assert leftovers(tmp_path) == []
    with pytest.raises(NotFound):
        list(store.iter_chunks(model_key("0" * 64)))
    assert not store.exists(model_key("0" * 64))


def test_iter_chunks_streams_exact_bytes(store, tmp_path):
    data = os.urandom(250_001)
    src, sha = blob(tmp_path, data)
    store.put_file(engine_key(sha), src, sha)
    chunks = list(store.iter_chunks(engine_key(sha), chunk_size=64 * 1024))
    assert b"".join(chunks) == data
    assert len(chunks) >= 4 and all(len(c) <= 64 * 1024 for c in chunks)


def test_keys_lists_by_prefix(store, tmp_path):
    put = {}
    for i, prefix in enumerate(["models", "models", "engines"]):
        src, sha = blob(tmp_path, f"blob {i}".encode(), f"b{i}.bin")
        key = model_key(sha) if prefix == "models" else engine_key(sha)
        store.put_file(key, src, sha)
        put[key] = prefix
    assert sorted(store.keys()) == sorted(put)
    assert sorted(store.keys("models/")) == sorted(k for k, p in put.items() if p == "models")
    assert list(store.keys("engines/")) == [k for k, p in put.items() if p == "engines"]
    assert list(store.keys("nothing/")) == []


def test_delete_removes(store, tmp_path):
    src, sha = blob(tmp_path, b"to be deleted")
    key = engine_key(sha)
    store.put_file(key, src, sha)
    store.delete(key)
    assert not store.exists(key)
    assert list(store.keys()) == []
    with pytest.raises(NotFound):
        store.get_file(key, tmp_path / "gone.bin")
    store.delete(key)  # deleting twice is fine


def test_empty_blob(store, tmp_path):
    src, sha = blob(tmp_path, b"")
    store.put_file(model_key(sha), src, sha)
    assert store.size(model_key(sha)) == 0
    dest = tmp_path / "empty.bin"
    store.get_file(model_key(sha), dest)
    assert dest.read_bytes() == b""


# --------------------------------------------------------------------------- local only


def test_local_rejects_keys_that_escape(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    src, sha = blob(tmp_path, b"x")
    for key in ["../escape", "models/../../escape", "/etc/passwd", "models/../engines/abc"]:
        with pytest.raises(ValueError, match="blob key"):
            store.put_file(key, src, sha)
        with pytest.raises(ValueError):
            store.exists(key)
    assert not (tmp_path / "escape").exists()
    assert list(store.keys()) == []


def test_local_wrong_sha_leaves_no_temp_file(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    src, _ = blob(tmp_path, b"bytes")
    with pytest.raises(IntegrityError):
        store.put_file("models/ab/abc", src, "f" * 64)
    assert [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()] == []


def test_get_blob_store_local(tmp_path):
    store = get_blob_store(Settings(data_dir=tmp_path))
    assert isinstance(store, LocalBlobStore) and store.root == tmp_path / "blobs"


# --------------------------------------------------------------------------- S3 only


def test_s3_multipart_upload(s3_store, tmp_path, monkeypatch):
    """A blob above the multipart threshold goes up in parts (threshold lowered to S3's 5 MiB minimum)."""
    monkeypatch.setattr(
        s3_module,
        "TRANSFER",
        TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=2),
    )
    store = s3_store
    data = os.urandom((12 << 20) + 123)
    src, sha = blob(tmp_path, data)
    key = engine_key(sha)
    store.put_file(key, src, sha)
    head = store.client.head_object(Bucket=store.bucket, Key=key)
    assert head["ETag"].strip('"').endswith("-3")  # three parts
    assert head["Metadata"]["sha256"] == sha
    store.put_file(key, src, sha)  # idempotent after a multipart upload too
    dest = tmp_path / "back.bin"
    store.get_file(key, dest)
    assert sha256_file(dest) == sha


def test_s3_via_get_blob_store(s3_store, s3_bucket, tmp_path):
    settings = s3_bucket
    store = get_blob_store(settings)
    assert isinstance(store, S3BlobStore) and store.bucket == settings.s3_bucket
    store.ensure_bucket()  # a second time: the bucket exists already
    src, sha = blob(tmp_path, b"via settings")
    store.put_file(model_key(sha), src, sha)
    assert get_blob_store(settings).exists(model_key(sha))


def test_s3_presigned_url_serves_the_bytes(s3_store, tmp_path):
    import httpx

    store = s3_store
    src, sha = blob(tmp_path, b"presigned bytes")
    store.put_file(engine_key(sha), src, sha)
    url = store.presigned_url(engine_key(sha), expires_seconds=60)
    assert httpx.get(url, timeout=10).content == b"presigned bytes"


def test_s3_missing_bucket_is_infrastructure_error(seaweedfs, tmp_path):
    client = boto3.client(
        "s3",
        endpoint_url=seaweedfs,
        region_name="us-east-1",
        aws_access_key_id=localservers.S3_KEY,
        aws_secret_access_key=localservers.S3_SECRET,
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )
    store = S3BlobStore(client, f"no-such-bucket-{uuid.uuid4().hex[:8]}")
    src, sha = blob(tmp_path, b"nowhere to go")
    with pytest.raises(InfrastructureError):
        store.put_file(model_key(sha), src, sha)


def _dead_endpoint() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once the socket closes


def test_s3_dead_endpoint_is_infrastructure_error(tmp_path):
    client = boto3.client(
        "s3",
        endpoint_url=_dead_endpoint(),
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=1, s3={"addressing_style": "path"}),
    )
    store = S3BlobStore(client, "enginefarm")
    src, sha = blob(tmp_path, b"unreachable")
    started = time.monotonic()
    with pytest.raises(InfrastructureError, match="S3 unreachable"):
        store.exists(model_key(sha))
    with pytest.raises(InfrastructureError):
        store.put_file(model_key(sha), src, sha)
    with pytest.raises(InfrastructureError):
        store.get_file(model_key(sha), tmp_path / "dest.bin")
    with pytest.raises(InfrastructureError):
        list(store.keys())
    assert time.monotonic() - started < 20
    assert not (tmp_path / "dest.bin").exists() and leftovers(tmp_path) == []


def test_s3_from_settings_on_dead_endpoint_is_infrastructure_error():
    started = time.monotonic()
    with pytest.raises(InfrastructureError):
        S3BlobStore.from_settings(s3_settings(_dead_endpoint()))
    assert time.monotonic() - started < 20


def test_a_hashed_file_is_linked_into_a_local_store_not_copied(tmp_path):
    """The upload spool hashed the file as it wrote it: the local store puts the very inode in place."""
    store = LocalBlobStore(tmp_path / "blobs")
    src = tmp_path / "spool"
    src.write_bytes(b"engine bytes" * 1000)
    sha = sha256_file(src)
    store.put_file(engine_key(sha), src, sha, hashed=True)
    stored = store.local_path(engine_key(sha))
    assert stored.stat().st_ino == src.stat().st_ino and stored.read_bytes() == src.read_bytes()
    src.unlink()  # the spool goes; the blob stays
    assert sha256_file(stored) == sha
    assert [p.name for p in stored.parent.iterdir()] == [stored.name]  # no temp file left


def test_a_hashed_put_to_s3_reads_the_file_once(s3_store, tmp_path, monkeypatch):
    """With the sha256 known, S3 gets the file without a hashing pass over it first, and no read-back HEAD."""
    store = s3_store
    src = tmp_path / "m.onnx"
    src.write_bytes(b"model bytes" * 5000)
    sha = sha256_file(src)

    def no_rehash(_path):
        raise AssertionError("hashed again")

    monkeypatch.setattr(s3_module, "sha256_file", no_rehash)
    heads = []
    real_head = store._head
    monkeypatch.setattr(store, "_head", lambda key: heads.append(key) or real_head(key))
    store.put_file(model_key(sha), src, sha, hashed=True)
    assert heads == [model_key(sha)]  # the one that asks whether the bytes are there already
    monkeypatch.undo()
    out = tmp_path / "back"
    store.get_file(model_key(sha), out)
    assert out.read_bytes() == src.read_bytes()
