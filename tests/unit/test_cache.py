"""``enginefarm.cache``: the deploy side's local engine cache, on real files in tmp_path."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest

from enginefarm.client import cache as cache_mod
from enginefarm.client.cache import TMP_PREFIX, EngineCache, default_cache_dir
from enginefarm.core.errors import IntegrityError, NotFound

PAYLOAD = random.Random(20).randbytes(3 * 1024 + 17)  # the same in every process: xdist collects by name
SHA = hashlib.sha256(PAYLOAD).hexdigest()


def sha_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record(data: bytes, model: str = "resnet", version: str = "1", **kw) -> dict:
    return {
        "id": 1,
        "model_name": model,
        "model_version": version,
        "target": "tensorrt/sm86",
        "sha256": sha_of(data),
        "size": len(data),
        "created_at": "2025-01-01T00:00:00+00:00",
    } | kw


def put(cache: EngineCache, data: bytes, **kw) -> str:
    with cache.writer(sha_of(data)) as out:
        out.write(data)
    cache.remember(record(data, **kw), "http://farm:8000")
    return sha_of(data)


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if TMP_PREFIX in p.name]


@pytest.fixture
def cache(tmp_path: Path) -> EngineCache:
    return EngineCache(tmp_path / "cache")


def test_round_trip(cache: EngineCache, tmp_path: Path) -> None:
    assert not cache.has(SHA)
    with cache.writer(SHA) as out:
        for i in range(0, len(PAYLOAD), 1000):  # streamed in chunks, as a download is
            out.write(PAYLOAD[i : i + 1000])
    cache.remember(record(PAYLOAD), "http://farm:8000")

    assert cache.path(SHA) == cache.root / "blobs" / SHA[:2] / SHA
    assert cache.has(SHA) and cache.has(SHA, verify=False)
    dest = cache.copy_to(SHA, tmp_path / "deploy" / "sub" / "model.engine")
    assert dest.read_bytes() == PAYLOAD
    assert cache.size_bytes() == len(PAYLOAD)
    assert temp_files(tmp_path) == []

    rec = cache.record(SHA)
    assert rec["sha256"] == SHA and rec["cached_from"] == "http://farm:8000" and rec["cached_at"]
    assert json.loads((cache.root / "engines" / f"{SHA}.json").read_text())["model_name"] == "resnet"


def test_copy_to_missing_blob_is_not_found(cache: EngineCache, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        cache.copy_to(SHA, tmp_path / "model.engine")
    assert not (tmp_path / "model.engine").exists()


def test_wrong_digest_leaves_nothing(cache: EngineCache) -> None:
    with pytest.raises(IntegrityError):
        with cache.writer(SHA) as out:
            out.write(PAYLOAD[:-1] + b"X")
    assert not cache.path(SHA).exists()
    assert not cache.has(SHA)
    assert temp_files(cache.root) == []


def test_exception_inside_writer_leaves_nothing(cache: EngineCache) -> None:
    with pytest.raises(ConnectionError):
        with cache.writer(SHA) as out:
            out.write(PAYLOAD[:100])
            raise ConnectionError("download dropped")
    assert not cache.path(SHA).exists()
    assert temp_files(cache.root) == []


def test_failed_rewrite_keeps_the_good_blob(cache: EngineCache) -> None:
    put(cache, PAYLOAD)
    with pytest.raises(IntegrityError):
        with cache.writer(SHA) as out:
            out.write(b"garbage")
    assert cache.path(SHA).read_bytes() == PAYLOAD
    assert cache.has(SHA)


def test_corrupt_blob_is_detected_and_evicted(cache: EngineCache, tmp_path: Path) -> None:
    put(cache, PAYLOAD)
    blob = cache.path(SHA)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))

    assert cache.has(SHA, verify=False)  # only existence is checked
    assert not cache.has(SHA)
    assert not blob.exists() and cache.record(SHA) is None
    with pytest.raises(NotFound):
        cache.copy_to(SHA, tmp_path / "model.engine")


def test_truncated_blob_fails_the_size_check(cache: EngineCache, monkeypatch: pytest.MonkeyPatch) -> None:
    put(cache, PAYLOAD)
    cache.path(SHA).write_bytes(PAYLOAD[:10])
    monkeypatch.setattr(cache_mod, "sha256_file", lambda path: SHA)  # only the size can catch it
    assert not cache.has(SHA)
    assert not cache.path(SHA).exists()


def test_copy_to_of_corrupt_blob_raises_and_evicts(cache: EngineCache, tmp_path: Path) -> None:
    put(cache, PAYLOAD)
    cache.path(SHA).write_bytes(b"not the engine")
    dest = tmp_path / "model.engine"
    with pytest.raises(IntegrityError):
        cache.copy_to(SHA, dest)
    assert not dest.exists()
    assert not cache.path(SHA).exists()
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize(
    "bad",
    [
        "../x",
        "../" + "a" * 61,
        SHA.upper(),
        SHA[:63],
        SHA + "0",
        SHA[:63] + "g",
        SHA + "\n",
        "",
        "a" * 62 + "/.",
        None,
        123,
    ],
)
def test_bad_sha_rejected(cache: EngineCache, bad: object) -> None:
    with pytest.raises(ValueError):
        cache.path(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cache.has(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        with cache.writer(bad):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError):
        cache.remember({"sha256": bad}, "http://farm")
    assert not cache.root.exists()  # nothing was created anywhere


def test_records_filter_and_skip_corrupt(cache: EngineCache) -> None:
    a = put(cache, b"engine a", model="resnet", version="1")
    b = put(cache, b"engine b", model="resnet", version="2")
    c = put(cache, b"engine c", model="bert", version="1")
    engines = cache.root / "engines"
    (engines / f"{'d' * 64}.json").write_text('{"model_name": "resnet", ')  # a truncated write
    (engines / f"{'e' * 64}.json").write_text("[1, 2]")  # not an object
    (engines / f"{'f' * 64}.json").write_bytes(b"\xff\xfe")  # not UTF-8

    assert {r["sha256"] for r in cache.records()} == {a, b, c}
    assert {r["sha256"] for r in cache.records(model="resnet")} == {a, b}
    assert [r["sha256"] for r in cache.records(model="resnet", version="2")] == [b]
    assert [r["sha256"] for r in cache.records(version="1", model="bert")] == [c]
    assert cache.records(model="gpt") == []


def test_records_of_empty_cache(tmp_path: Path) -> None:
    assert EngineCache(tmp_path / "nowhere").records() == []
    assert EngineCache(tmp_path / "nowhere").size_bytes() == 0


def test_remember_replaces_record(cache: EngineCache) -> None:
    put(cache, PAYLOAD, id=1)
    cache.remember(record(PAYLOAD, id=7), "http://other:8000")
    [rec] = cache.records()
    assert rec["id"] == 7 and rec["cached_from"] == "http://other:8000"
    assert temp_files(cache.root) == []


def test_copy_to_fails_mid_copy_atomically(cache: EngineCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put(cache, PAYLOAD)
    dest = tmp_path / "deploy" / "model.engine"
    dest.parent.mkdir()
    dest.write_bytes(b"previous engine")
    monkeypatch.setattr(cache_mod, "CHUNK", 1024)
    real_write = cache_mod.HashingWriter.write
    calls = []

    def write_then_fail(self, data):
        calls.append(len(data))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(cache_mod.HashingWriter, "write", write_then_fail)
    with pytest.raises(OSError, match="No space"):
        cache.copy_to(SHA, dest)
    assert len(calls) == 2  # the first chunk was written before the failure
    assert dest.read_bytes() == b"previous engine"
    assert list(dest.parent.iterdir()) == [dest]

    monkeypatch.undo()
    fresh = tmp_path / "fresh" / "model.engine"
    monkeypatch.setattr(cache_mod.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        cache.copy_to(SHA, fresh)
    assert list(fresh.parent.iterdir()) == []
    assert cache.has(SHA)  # a failed copy does not touch the cached blob


@pytest.mark.parametrize("by_name", [True, False], ids=["mtime-order-is-name-order", "mtime-order-reversed"])
def test_prune_evicts_least_recently_used(cache: EngineCache, tmp_path: Path, by_name: bool) -> None:
    shas = sorted(put(cache, bytes([i]) * 1000) for i in range(3))
    old, mid, new = shas if by_name else shas[::-1]
    now = time.time()
    for i, sha in enumerate((old, mid, new)):
        os.utime(cache.path(sha), (now - 3000 + i * 1000,) * 2)
    cache.copy_to(old, tmp_path / "used.engine")  # using it makes it the most recent

    assert cache.prune(10_000) == []
    assert cache.prune(2000) == [mid]
    assert not cache.has(mid, verify=False) and cache.record(mid) is None
    assert cache.has(old) and cache.has(new)
    assert cache.size_bytes() == 2000
    os.utime(cache.path(new), (now - 100,) * 2)  # set explicitly: two touches may share a clock tick
    assert cache.prune(1) == [new, old]
    assert cache.size_bytes() == 0 and cache.records() == []


def test_use_refreshes_mtime(cache: EngineCache, tmp_path: Path) -> None:
    put(cache, PAYLOAD)
    blob = cache.path(SHA)
    for use in (
        lambda: cache.has(SHA),
        lambda: cache.has(SHA, verify=False),
        lambda: cache.copy_to(SHA, tmp_path / "model.engine"),
    ):
        os.utime(blob, (1_000_000,) * 2)
        use()
        assert blob.stat().st_mtime > time.time() - 60


def test_prune_spares_writes_in_progress(cache: EngineCache) -> None:
    put(cache, PAYLOAD)
    with cache.writer(sha_of(b"incoming")) as out:
        out.write(b"incoming")
        assert cache.prune(0) == [SHA]
        assert len(temp_files(cache.root)) == 1
    assert cache.has(sha_of(b"incoming"))


def test_prune_removes_stale_temp_files(cache: EngineCache) -> None:
    put(cache, PAYLOAD)
    stale = cache.path(SHA).parent / f"{TMP_PREFIX}dead"
    fresh = cache.path(SHA).parent / f"{TMP_PREFIX}live"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    os.utime(stale, (time.time() - 2 * cache_mod.STALE_TMP_SECONDS,) * 2)
    assert cache.prune(10**9) == []
    assert not stale.exists() and fresh.exists()
    assert cache.size_bytes() == len(PAYLOAD)


def test_concurrent_writers_threads(cache: EngineCache) -> None:
    data = os.urandom(256 * 1024)
    sha = sha_of(data)
    barrier = threading.Barrier(4)

    def write() -> bool:
        with cache.writer(sha) as out:
            out.write(data[:1000])
            barrier.wait(timeout=10)  # every writer is mid-write at once
            out.write(data[1000:])
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(lambda _: write(), range(4)))
    assert cache.path(sha).read_bytes() == data
    assert cache.has(sha)
    assert temp_files(cache.root) == []


def _write_in_process(root: str, data: bytes, start: float) -> str:
    cache = EngineCache(Path(root))
    with cache.writer(sha_of(data)) as out:
        out.write(data[:1000])
        time.sleep(max(0.0, start - time.time()))  # overlap with the other processes
        out.write(data[1000:])
    cache.remember(record(data), "http://farm:8000")
    return sha_of(data)


def test_concurrent_writers_processes(cache: EngineCache) -> None:
    data = os.urandom(512 * 1024)
    start = time.time() + 2
    with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(_write_in_process, [str(cache.root)] * 3, [data] * 3, [start] * 3))
    assert results == [sha_of(data)] * 3
    assert cache.has(sha_of(data))
    assert [r["sha256"] for r in cache.records()] == [sha_of(data)]
    assert temp_files(cache.root) == []


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ENGINEFARM_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "enginefarm"

    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # ignored, as the XDG spec says
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "enginefarm"

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "enginefarm"

    monkeypatch.setenv("ENGINEFARM_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    assert EngineCache().root == tmp_path / "explicit"

    monkeypatch.setenv("ENGINEFARM_CACHE_DIR", "")  # empty counts as unset
    assert default_cache_dir() == tmp_path / "xdg" / "enginefarm"


def test_records_of_a_version_include_its_variants(tmp_path: Path) -> None:
    """An engine of a derived int8 model (version 1-int8-…) is a variant of version 1, offline as online."""
    cache = EngineCache(tmp_path)
    plain = put(cache, b"fp32 plan")
    variant = put(cache, b"int8 plan", version="1-int8-abcd1234", variant_of="1")
    other = put(cache, b"v2 plan", version="2")
    assert {r["sha256"] for r in cache.records("resnet", "1")} == {plain, variant}
    assert {r["sha256"] for r in cache.records("resnet", "2")} == {other}
    assert len(cache.records("resnet")) == 3
