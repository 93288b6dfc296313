"""The client against a farm that lies (``tests/hostile_farm.py``, a real HTTP server): no field of an answer names a
file, no symbolic link in the output folder is written through, and a download whose size or sha256 is not the one
declared leaves nothing behind. Each test snapshots the whole scratch tree (``victim/`` stands for what lies outside
the folders the user named) before and after the real CLI or SDK runs, and the system temp folder is one inside it."""

from __future__ import annotations

import io
import os
import re
import tarfile
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from enginefarm.client import Client, transport
from enginefarm.client.cli import app
from enginefarm.client.safepaths import UnsafeAnswer
from tests.hostile_farm import HostileFarm, outside, sha, tree

PLAN = b"ftrt" + bytes(range(256)) * 64  # not an ONNX model: a plan, as far as the client can tell
MODEL = b"onnx bytes: the export copies them, nothing reads them"
STRICT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
LEFTOVER = re.compile(r"\.tmp|staging")


@pytest.fixture
def hostile():
    f = HostileFarm()
    yield f
    f.close()


@pytest.fixture
def root(tmp_path, monkeypatch):
    """tmp_path holding victim/ (outside everything the user names) and systmp/, the process's temp folder."""
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep.txt").write_text("mine")
    (tmp_path / "systmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "systmp"))
    monkeypatch.delenv("ENGINEFARM_TOKEN", raising=False)
    monkeypatch.delenv("ENGINEFARM_CACHE_DIR", raising=False)
    # A download cut short is retried at once: the retries are real, their pauses are not.
    monkeypatch.setattr(transport, "time", SimpleNamespace(sleep=lambda s: None, monotonic=time.monotonic))
    return tmp_path


def cli(hostile: HostileFarm, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--api", hostile.url])
    return result.exit_code, " ".join(result.output.split())


def engine_doc(**over: Any) -> dict[str, Any]:
    return {
        "id": 11,
        "sha256": sha(PLAN),
        "size": len(PLAN),
        "backend": "tensorrt",
        "target": "tensorrt/sm86",
        "precision": "fp16",
        "accuracy_pass": None,
        "profiles": [],
        "compute_capability": "8.6",
        "compute_capabilities": ["8.6"],
        "hardware_compat": None,
        "model_name": "m",
        "model_version": "1",
        "variant_of": None,
    } | over


def serve_engine(hostile: HostileFarm, engine: dict[str, Any], data: bytes = PLAN, **blob: Any) -> None:
    answer = {"engine": engine, "match": "exact", "reason": "it fits", "accuracy": "unchecked", "model": "m"}
    hostile.json("POST", "/v1/resolve", answer)
    hostile.json("GET", "/v1/engines", {"items": [engine]})
    hostile.blob(f"/v1/engines/{engine['id']}/content", data, **blob)


def serve_model(hostile: HostileFarm, **over: Any) -> dict[str, Any]:
    model = {
        "id": 7,
        "name": "m",
        "version": "1",
        "format": "onnx",
        "sha256": sha(MODEL),
        "size": len(MODEL),
        "source_model_id": None,
        "inputs": [],
        "outputs": [],
    } | over
    hostile.json("GET", "/v1/models", {"items": [model]})
    hostile.blob("/v1/models/7/content", MODEL)
    return model


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if LEFTOVER.search(p.name)] if folder.exists() else []


def downloads(hostile: HostileFarm) -> list[str]:
    return [path for method, path in hostile.requests if path.endswith("/content")]


# ------------------------------------------------------------------------------------------------ export triton


@pytest.mark.parametrize(
    "fmt",
    [
        "x/../../../victim/pwned.txt",  # the red team's: the scratch file landed in victim/ with the right sha256
        "zip/../../../victim/pwned.txt",
        "/victim/pwned.txt",
        "ONNX",
        "",
    ],
)
def test_export_refuses_a_format_it_does_not_know_before_writing_anything(hostile, root, fmt):
    serve_model(hostile, format=fmt)
    serve_engine(hostile, engine_doc())
    before = tree(root)
    code, said = cli(hostile, "export", "triton", "m", "--out", str(root / "out"), "--cache-dir", str(root / "cache"))
    assert not (root / "victim" / "pwned.txt").exists()
    assert outside(before, tree(root)) == {}  # nothing at all: not the repository, not the cache, not a scratch file
    assert code == 1 and "format" in said and "nothing was written" in said, said
    assert downloads(hostile) == []


def hostile_tar(member: str, link: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("model.onnx"), io.BytesIO(b""))
        info = tarfile.TarInfo(member)
        if link is None:
            info.size = 5
            tar.addfile(info, io.BytesIO(b"pwned"))
        else:
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("member", "link"),
    [("../../../victim/pwned.txt", None), ("/victim/pwned.txt", None), ("data.bin", "../../../victim/keep.txt")],
    ids=["dot-dot", "absolute", "symlink"],
)
def test_export_refuses_a_bundle_whose_members_reach_out(hostile, root, member, link):
    bundle = hostile_tar(member, link)
    serve_model(hostile, format="tar", sha256=sha(bundle), size=len(bundle))
    hostile.blob("/v1/models/7/content", bundle)
    serve_engine(hostile, engine_doc())
    before = tree(root)
    code, said = cli(hostile, "export", "triton", "m", "--out", str(root / "out"), "--cache-dir", str(root / "cache"))
    assert code == 1 and "bundle entry" in said, said
    assert outside(before, tree(root), "cache") == {} and not (root / "out").exists()


def test_export_names_every_file_itself_whatever_the_answers_say(hostile, root):
    serve_model(hostile, name="../../victim/m", version="../../victim")
    serve_engine(hostile, engine_doc(target="../../../victim/x", model_name="/victim/m", model_version="../../victim"))
    before = tree(root)
    code, said = cli(hostile, "export", "triton", "m", "--out", str(root / "out"), "--cache-dir", str(root / "cache"))
    assert code == 0, said
    assert outside(before, tree(root), "out", "cache") == {}
    models = sorted(p.name for p in (root / "out").iterdir())
    assert len(models) == 2 and all(STRICT.fullmatch(m) for m in models), models
    written = [p for p in (root / "out").rglob("*") if p.is_file()]
    assert all(Path(os.path.realpath(p)).is_relative_to(root / "out") for p in written)
    assert sorted(p.read_bytes() for p in written if p.suffix in (".plan", ".onnx")) == sorted([PLAN, MODEL])
    assert leftovers(root / "out") == leftovers(root / "cache") == []


@pytest.mark.parametrize("field", [{"id": "../../victim/x"}, {"id": True}, {"sha256": "../../../victim/x"}])
def test_export_refuses_an_engine_id_or_sha256_that_is_not_one(hostile, root, field):
    serve_model(hostile)
    serve_engine(hostile, engine_doc(**field))
    before = tree(root)
    code, said = cli(hostile, "export", "triton", "m", "--out", str(root / "out"), "--cache-dir", str(root / "cache"))
    assert code == 1, said
    assert outside(before, tree(root), "cache") == {} and not (root / "out").exists()
    assert not (root / "cache" / "blobs").exists() and leftovers(root / "cache") == []


def test_export_replaces_a_linked_model_folder_without_following_it(hostile, root):
    serve_model(hostile)
    serve_engine(hostile, engine_doc())
    (root / "out").mkdir()
    (root / "out" / "m").symlink_to(root / "victim", target_is_directory=True)
    before = tree(root)
    code, said = cli(
        hostile, "export", "triton", "m", "--out", str(root / "out"), "--overwrite", "--cache-dir", str(root / "cache")
    )
    assert code == 0, said
    assert outside(before, tree(root), "out", "cache") == {}  # victim/ untouched
    assert not (root / "out" / "m").is_symlink() and (root / "out" / "m" / "1" / "model_sm86.plan").read_bytes() == PLAN


# ------------------------------------------------------------------------------------------------ fetch


@pytest.mark.parametrize("cached", [True, False], ids=["through-the-cache", "no-cache"])
def test_fetch_names_the_file_itself_whatever_the_answer_says(hostile, root, cached):
    serve_engine(hostile, engine_doc(target="../../../victim/x", model_name="/victim/../../m", backend="../../x"))
    (root / "dl").mkdir()
    before = tree(root)
    cache = ["--cache-dir", str(root / "cache")] if cached else ["--no-cache"]
    code, said = cli(hostile, "fetch", "m", "-o", str(root / "dl"), "--cc", "8.6", *cache)
    assert code == 0, said
    assert outside(before, tree(root), "dl", "cache") == {}
    [written] = (root / "dl").iterdir()
    assert STRICT.fullmatch(written.name) and written.suffix == ".plan" and written.read_bytes() == PLAN


@pytest.mark.parametrize("cached", [True, False], ids=["through-the-cache", "no-cache"])
def test_fetch_replaces_a_link_at_the_name_and_never_writes_through_it(hostile, root, cached):
    serve_engine(hostile, engine_doc())
    (root / "dl").mkdir()
    (root / "dl" / "m-tensorrt-sm86.plan").symlink_to(root / "victim" / "keep.txt")
    before = tree(root)
    cache = ["--cache-dir", str(root / "cache")] if cached else ["--no-cache"]
    code, said = cli(hostile, "fetch", "m", "-o", str(root / "dl"), "--cc", "8.6", *cache)
    assert code == 0, said
    assert outside(before, tree(root), "dl", "cache") == {} and (root / "victim" / "keep.txt").read_text() == "mine"
    link = root / "dl" / "m-tensorrt-sm86.plan"
    assert not link.is_symlink() and link.read_bytes() == PLAN


@pytest.mark.parametrize(
    "lie",
    [
        {"length": len(PLAN) + 4096},  # the body ends before the declared length (every retry too)
        {"length": len(PLAN) - 4096},  # the declared length ends before the body the sha256 is of
        {"sha256": sha(b"other")},  # the header's sha256 is not the bytes'
        {"data": PLAN[:-1] + b"!"},  # the bytes are not the ones the record's sha256 names
    ],
    ids=["short-body", "long-body", "header-sha256", "record-sha256"],
)
@pytest.mark.parametrize("cached", [True, False], ids=["through-the-cache", "no-cache"])
def test_a_download_that_is_not_what_was_declared_leaves_nothing(hostile, root, lie, cached):
    serve_engine(hostile, engine_doc(), **lie)
    (root / "dl").mkdir()
    before = tree(root)
    cache = ["--cache-dir", str(root / "cache")] if cached else ["--no-cache"]
    code, said = cli(hostile, "fetch", "m", "-o", str(root / "dl"), "--cc", "8.6", *cache)
    assert code == 1, said
    assert outside(before, tree(root), "cache") == {} and list((root / "dl").iterdir()) == []
    assert [p for p in (root / "cache").rglob("*") if not p.is_dir()] == []
    assert len(downloads(hostile)) == (4 if "length" in lie and lie["length"] > len(PLAN) else 1)


@pytest.mark.parametrize("resume_from", [None, 0, 1000], ids=["honest", "from-the-start", "elsewhere"])
def test_a_broken_download_resumes_only_where_it_stopped(hostile, root, resume_from):
    """The connection breaks after 1.5 MB (the client has written its first 1 MiB chunk); the farm answers the resume
    with a range starting where asked, at 0 (the bytes again, appended), or elsewhere. Only the honest one is
    written."""
    big = PLAN * 200  # 3.3 MB
    serve_engine(hostile, engine_doc(sha256=sha(big), size=len(big)), big, cut=1_500_000, resume_from=resume_from)
    (root / "dl").mkdir()
    before = tree(root)
    code, said = cli(hostile, "fetch", "m", "-o", str(root / "dl"), "--cc", "8.6", "--no-cache")
    assert outside(before, tree(root), "dl") == {} and len(downloads(hostile)) == 2
    if resume_from is None:
        assert code == 0 and (root / "dl" / "m-tensorrt-sm86.plan").read_bytes() == big, said
    else:
        assert code == 1 and f"resume at byte {1 << 20}" in said, said
        assert list((root / "dl").iterdir()) == []


@pytest.mark.parametrize("cached", [True, False], ids=["through-the-cache", "no-cache"])
def test_a_download_of_another_size_than_its_record_leaves_nothing(hostile, root, cached):
    """The bytes match the record's sha256 and their Content-Length, but not the size the record gives."""
    serve_engine(hostile, engine_doc(size=len(PLAN) + 1))
    (root / "dl").mkdir()
    before = tree(root)
    cache = ["--cache-dir", str(root / "cache")] if cached else ["--no-cache"]
    code, said = cli(hostile, "fetch", "m", "-o", str(root / "dl"), "--cc", "8.6", *cache)
    assert code == 1 and "bytes, expected" in said, said
    assert outside(before, tree(root), "cache") == {} and list((root / "dl").iterdir()) == []
    assert leftovers(root / "cache") == []


# ------------------------------------------------------------------------------------------------ a build's engines


def serve_build(hostile: HostileFarm, targets: list[str], engine_id: Any = 11) -> None:
    tasks = [
        {"id": i, "target": t, "state": "succeeded", "engine_id": engine_id, "error": None, "status_detail": None}
        for i, t in enumerate(targets)
    ]
    hostile.json("GET", "/v1/builds/5", {"id": 5, "state": "succeeded", "tasks": tasks})
    hostile.json("GET", "/v1/engines/11", engine_doc())
    hostile.blob("/v1/engines/11/content", PLAN)


def test_download_all_names_each_engine_itself(hostile, root):
    serve_build(hostile, ["../../victim/x", "/victim/y", ".."])
    before = tree(root)
    with Client(hostile.url) as c:
        paths = c.job(5).download_all(root / "dl")
    assert outside(before, tree(root), "dl") == {}
    assert len(set(paths.values())) == 3
    for path in paths.values():
        assert path.parent == root / "dl" and STRICT.fullmatch(path.name) and path.read_bytes() == PLAN


@pytest.mark.parametrize(
    ("targets", "engine_id"),
    [(["tensorrt/sm86", "tensorrt-sm86"], 11), (["tensorrt/sm86"], "../../victim/x")],
    ids=["two-targets-one-name", "engine-id-a-path"],
)
def test_download_all_refuses_before_downloading(hostile, root, targets, engine_id):
    serve_build(hostile, targets, engine_id)
    before = tree(root)
    with Client(hostile.url) as c, pytest.raises(UnsafeAnswer):
        c.job(5).download_all(root / "dl")
    assert outside(before, tree(root), "dl") == {} and downloads(hostile) == []
    assert not (root / "dl").exists() or list((root / "dl").iterdir()) == []


# ------------------------------------------------------------------------------------------------ ci


def ci(hostile: HostileFarm, root: Path) -> tuple[int, str]:
    """A CI run the farm refuses at the upload: the gate says so in the JUnit XML and the summary."""
    hostile.json("GET", "/v1/models", {"items": []})
    hostile.json("POST", "/v1/models", {"error": "ModelRejected", "detail": "refused here"}, status=422)
    (root / "in").mkdir(exist_ok=True)
    (root / "in" / "m.onnx").write_bytes(MODEL)
    junit, summary = str(root / "reports" / "junit.xml"), str(root / "reports" / "summary.md")
    return cli(hostile, "ci", str(root / "in" / "m.onnx"), "--name", "m", "-t", "onnxruntime/cpu-x86_64",
               "--junit", junit, "--summary", summary)  # fmt: skip


def test_ci_junit_never_writes_through_a_link_at_a_temporary_name(hostile, root):
    (root / "reports").mkdir()
    (root / "reports" / ".junit.xml.tmp").symlink_to(root / "victim" / "keep.txt")  # the old fixed temporary name
    (root / "reports" / "junit.xml").symlink_to(root / "victim" / "junit.xml")
    (root / "in").mkdir()
    before = tree(root)
    code, said = ci(hostile, root)
    assert code == 1 and "refused here" in said, said
    assert outside(before, tree(root), "reports", "in") == {}  # victim/keep.txt unchanged, no victim/junit.xml
    junit = root / "reports" / "junit.xml"
    assert not junit.is_symlink() and "refused here" in junit.read_text()
    assert leftovers(root / "reports") == [".junit.xml.tmp"]  # the planted link, left as it was


def test_ci_summary_is_not_appended_through_a_link(hostile, root):
    (root / "reports").mkdir()
    (root / "reports" / "summary.md").symlink_to(root / "victim" / "keep.txt")
    (root / "in").mkdir()
    before = tree(root)
    code, said = ci(hostile, root)
    assert code == 2 and "symbolic link" in said, said
    assert (root / "victim" / "keep.txt").read_text() == "mine"
    assert outside(before, tree(root), "reports", "in") == {}
    assert (root / "reports" / "summary.md").is_symlink()
