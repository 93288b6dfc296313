"""Engine plans and a local store's copies written around the page cache (enginefarm/core/directwrite.py): the same
bytes and hash as a plain write, whatever the sizes and pieces, none of them left in the page cache, and the usual
write where a file system refuses O_DIRECT."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import random
import resource
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from enginefarm.core import directwrite
from enginefarm.core.directwrite import ALIGN, STAGE, DirectFile, write_hashed
from enginefarm.core.hashing import sha256_file
from storage.blobs.local import LocalBlobStore

SIZES = [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, STAGE - 1, STAGE, STAGE + 7, 2 * STAGE + ALIGN + 3]
TMPFS = Path("/dev/shm")
# The page cache is only skipped on a disk: pytest's own temp folder may be a tmpfs (where every file is page
# cache), so what is checked against the page cache lives beside the checkout, as a farm's data directory does.
ON_DISK = Path(__file__).resolve().parents[2] / "build" / "test-directwrite"


def cached_bytes(path: Path) -> int:
    """How many of the file's bytes the page cache holds (util-linux's fincore)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[0])


def new_file(path: Path) -> DirectFile:
    return DirectFile(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))


@pytest.fixture
def disk():
    folder = ON_DISK / uuid.uuid4().hex
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def plans_direct():
    """``write_plans_direct``, for the test to call; this process's plain default again afterwards."""
    yield directwrite.write_plans_direct
    directwrite.write_plans_direct(False)


@pytest.fixture
def tmpfs():
    folder = Path(tempfile.mkdtemp(dir=TMPFS))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_the_bytes_and_the_hash_are_those_given_for_every_size_and_any_pieces(where, request, plans_direct):
    folder = request.getfixturevalue(where)
    plans_direct(True)
    rng = random.Random(7)
    for size in SIZES:
        data = rng.randbytes(size)
        whole = folder / f"whole-{size}"
        assert write_hashed(whole, data) == hashlib.sha256(data).hexdigest()
        assert whole.read_bytes() == data, size
        pieces = folder / f"pieces-{size}"
        with new_file(pieces) as out:
            at = 0
            while at < size:
                step = rng.choice([1, 511, ALIGN, 65536, 300_001, STAGE + 1])
                assert out.write(memoryview(data)[at : at + step]) == len(data[at : at + step])
                at += step
            assert out.size == size
        assert pieces.read_bytes() == data, size


def test_a_plan_written_direct_leaves_nothing_in_the_page_cache_and_a_plain_one_does(disk, plans_direct):
    data = random.Random(3).randbytes(3 * STAGE + 5)
    plans_direct(True)
    write_hashed(disk / "direct.plan", data)
    plans_direct(False)
    write_hashed(disk / "plain.plan", data)
    assert cached_bytes(disk / "direct.plan") <= ALIGN  # at most the last, padded block's page
    assert cached_bytes(disk / "plain.plan") >= len(data) - ALIGN
    assert (disk / "direct.plan").read_bytes() == (disk / "plain.plan").read_bytes() == data


def test_the_local_store_copies_and_fetches_around_the_page_cache(disk):
    data = random.Random(5).randbytes(2 * STAGE + 99)
    src = disk / "src.bin"
    src.write_bytes(data)
    store = LocalBlobStore(disk / "blobs")
    sha = hashlib.sha256(data).hexdigest()
    store.put_file("models/x", src, sha)  # not hashed by the caller: copied, verified, fsynced
    stored = store.local_path("models/x")
    assert cached_bytes(stored) <= ALIGN
    fetched = disk / "cache" / "model.onnx"
    store.get_file("models/x", fetched)
    assert cached_bytes(fetched) <= ALIGN
    assert stored.read_bytes() == fetched.read_bytes() == data


def test_a_file_system_that_refuses_the_flag_gets_a_plain_write(tmp_path, monkeypatch):
    real = fcntl.fcntl

    def refusing(fd, cmd, arg=0):
        if cmd == fcntl.F_SETFL and arg & directwrite.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refusing)
    data = random.Random(9).randbytes(STAGE + 3)
    with new_file(tmp_path / "f") as out:
        assert not out.direct
        out.write(data)
    assert (tmp_path / "f").read_bytes() == data


def test_a_file_system_that_refuses_the_writes_gets_the_rest_written_plainly(tmp_path, monkeypatch):
    real, refused = os.write, []

    def refusing_direct(fd, data):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & directwrite.O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    monkeypatch.setattr(os, "write", refusing_direct)
    data = random.Random(11).randbytes(2 * STAGE + 17)
    with new_file(tmp_path / "f") as out:
        assert out.direct
        out.write(data)
        assert not out.direct
    assert refused == [STAGE]
    assert (tmp_path / "f").read_bytes() == data


@pytest.mark.parametrize("direct", [True, False], ids=["local-store worker", "s3 worker"])
def test_a_tensorrt_rtx_plan_is_hashed_as_written_and_direct_only_where_a_local_store_takes_it(
    direct, disk, plans_direct
):
    from enginefarm.core.domain import Target
    from enginefarm.core.spec import BuildSpec
    from enginefarm.graph.samples import conv_net, sample_spec
    from worker.backends import BuildLog
    from worker.pipeline import engine_from_model

    model = disk / "model.onnx"
    model.write_bytes(conv_net(channels=160, blocks=3, seed=21).SerializeToString())  # a plan of a few MB
    (disk / "s").mkdir()
    plans_direct(direct)
    built = engine_from_model(
        model, BuildSpec(**sample_spec()), Target.parse("tensorrt-rtx/sm86"), None, disk / "s", BuildLog()
    )
    size = built.path.stat().st_size
    assert size > 1 << 20
    cached = cached_bytes(built.path)
    assert cached <= ALIGN if direct else cached >= size - ALIGN
    assert (built.descriptor.sha256, built.descriptor.size) == (sha256_file(built.path), size)


def test_a_write_after_close_is_refused_and_one_after_sync_follows_the_bytes(tmp_path):
    closed = new_file(tmp_path / "closed")
    closed.write(b"x" * 5000)
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        closed.write(b"more")
    assert (tmp_path / "closed").read_bytes() == b"x" * 5000
    synced = new_file(tmp_path / "synced")
    synced.write(b"a" * 5000)
    synced.sync()
    synced.write(b"b" * 100)
    synced.close()
    assert (tmp_path / "synced").read_bytes() == b"a" * 5000 + b"b" * 100


def test_a_write_that_fails_midway_closes_the_file_and_the_store_keeps_no_part(disk):
    """EFBIG from a file size limit stands for any write error (ENOSPC alike): raised, the descriptor closed, and
    the local store's temporary file gone."""
    data = random.Random(13).randbytes(3 * STAGE)
    src = disk / "src.bin"
    src.write_bytes(data)
    store = LocalBlobStore(disk / "blobs")
    open_fds = len(os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (STAGE + ALIGN, hard))
    try:
        with pytest.raises(OSError) as failed:
            store.put_file("engines/x", src, hashlib.sha256(data).hexdigest())
        with pytest.raises(OSError):
            write_hashed(disk / "plan", data)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert failed.value.errno == errno.EFBIG
    assert not store.exists("engines/x")
    assert [p.name for p in (disk / "blobs").rglob("*") if p.is_file()] == []
    assert len(os.listdir("/proc/self/fd")) == open_fds


def test_a_local_store_workers_engines_are_written_around_the_page_cache(disk, base_services):
    """The worker process itself (``enginefarm worker``) chooses O_DIRECT for a local store before its pool forks:
    an engine it built and stored, which nothing has read since, is not in the page cache."""
    from enginefarm.client import Client
    from enginefarm.core.config import Settings
    from enginefarm.graph.samples import conv_net, sample_spec
    from server.embedded import Farm, embedded_env, issue_token
    from storage.blobs import engine_key, get_blob_store

    env = embedded_env(disk / "farm")
    settings = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()})
    farm = Farm(env, log_dir=disk, token=issue_token(settings, "direct", ["admin"]))
    try:
        farm.start_api()
        farm.start_worker("direct", ["tensorrt-rtx/sm86"], concurrency=1)
        farm.wait_workers(["direct"])
        spec = {**sample_spec(), "benchmark": {"enabled": False}, "accuracy": {"enabled": False}}
        with Client(farm.url, token=farm.token) as c:
            model = c.upload(conv_net(channels=160, blocks=3, seed=31).SerializeToString(), "direct")[0]
            build = c.build(model["id"], ["tensorrt-rtx/sm86"], spec)
            (task,) = c.wait_build(build["id"], timeout=300)["tasks"]
            assert task["state"] == "succeeded", task
            engine = c.get(f"/v1/engines/{task['engine_id']}")
    finally:
        farm.stop()
    stored = get_blob_store(settings).local_path(engine_key(engine["sha256"]))
    assert stored.stat().st_size == engine["size"] > 1 << 20
    assert cached_bytes(stored) <= ALIGN
    assert sha256_file(stored) == engine["sha256"]
