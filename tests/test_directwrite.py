"""Engine plans and a local store's copies written around the page cache (enginefarm/core/directwrite.py): the same
bytes and hash as a plain write, whatever the sizes and pieces, none of them left in the page cache, and the usual
write where a file system refuses O_DIRECT."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import random
import subprocess
from pathlib import Path

import pytest

from enginefarm.core import directwrite
from enginefarm.core.directwrite import ALIGN, STAGE, DirectFile, write_hashed
from enginefarm.core.hashing import sha256_file
from enginefarm.storage.blobs.local import LocalBlobStore

SIZES = [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, STAGE - 1, STAGE, STAGE + 7, 2 * STAGE + ALIGN + 3]
TMPFS = Path("/dev/shm")


def cached_bytes(path: Path) -> int:
    """How many of the file's bytes the page cache holds (util-linux's fincore)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[0])


def new_file(path: Path) -> DirectFile:
    return DirectFile(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))


@pytest.fixture
def plans_direct():
    directwrite.write_plans_direct(True)
    yield
    directwrite.write_plans_direct(False)


@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_the_bytes_and_the_hash_are_those_given_for_every_size_and_any_pieces(where, tmp_path, plans_direct):
    folder = tmp_path if where == "disk" else Path(os.path.join(TMPFS, f"dw-{os.getpid()}"))
    folder.mkdir(exist_ok=True)
    rng = random.Random(7)
    try:
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
    finally:
        if where == "tmpfs":
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()


def test_a_plan_written_direct_leaves_nothing_in_the_page_cache_and_a_plain_one_does(tmp_path):
    data = random.Random(3).randbytes(3 * STAGE + 5)
    directwrite.write_plans_direct(True)
    try:
        write_hashed(tmp_path / "direct.plan", data)
    finally:
        directwrite.write_plans_direct(False)
    write_hashed(tmp_path / "plain.plan", data)
    assert cached_bytes(tmp_path / "direct.plan") <= ALIGN  # at most the last, padded block's page
    assert cached_bytes(tmp_path / "plain.plan") >= len(data) - ALIGN
    assert (tmp_path / "direct.plan").read_bytes() == (tmp_path / "plain.plan").read_bytes() == data


def test_the_local_store_copies_and_fetches_around_the_page_cache(tmp_path):
    data = random.Random(5).randbytes(2 * STAGE + 99)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    store = LocalBlobStore(tmp_path / "blobs")
    sha = hashlib.sha256(data).hexdigest()
    store.put_file("models/x", src, sha)  # not hashed by the caller: copied, verified, fsynced
    stored = store.local_path("models/x")
    assert cached_bytes(stored) <= ALIGN
    fetched = tmp_path / "cache" / "model.onnx"
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
def test_a_tensorrt_rtx_plan_is_hashed_as_written_and_direct_only_where_a_local_store_takes_it(direct, tmp_path):
    from enginefarm.core.domain import Target
    from enginefarm.core.spec import BuildSpec
    from enginefarm.graph.samples import conv_net, sample_spec
    from enginefarm.worker.backends import BuildLog
    from enginefarm.worker.pipeline import engine_from_model

    model = tmp_path / "model.onnx"
    model.write_bytes(conv_net(channels=160, blocks=3, seed=21).SerializeToString())  # a plan of a few MB
    (tmp_path / "s").mkdir()
    directwrite.write_plans_direct(direct)
    try:
        built = engine_from_model(
            model, BuildSpec(**sample_spec()), Target.parse("tensorrt-rtx/sm86"), None, tmp_path / "s", BuildLog()
        )
    finally:
        directwrite.write_plans_direct(False)
    size = built.path.stat().st_size
    assert size > 1 << 20
    cached = cached_bytes(built.path)
    assert cached <= ALIGN if direct else cached >= size - ALIGN
    assert (built.descriptor.sha256, built.descriptor.size) == (sha256_file(built.path), size)
