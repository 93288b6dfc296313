"""The client's names and writes (``enginefarm.client.safepaths``): names made only of safe characters, paths checked
to lie in their folder, temporary files that are never an existing link, and nothing partial left on failure. The
same against a farm that lies: tests/integration/test_hostile_farm.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from enginefarm.client import safepaths
from enginefarm.client.artifacts import default_name
from enginefarm.client.safepaths import (
    UnsafeAnswer,
    UnsafePath,
    atomic_write,
    check_name,
    in_folder,
    inside,
    record_id,
    safe_name,
    write_text,
)
from enginefarm.client.tritonexport import UPLOAD_FILES, upload_name
from enginefarm.core.bundle import FORMATS
from enginefarm.core.errors import IntegrityError


@pytest.mark.parametrize(
    ("raw", "safe"),
    [
        ("resnet50-tensorrt-sm86", "resnet50-tensorrt-sm86"),
        ("../../etc/passwd", "_.._etc_passwd"),
        ("/abs/path", "_abs_path"),
        ("..", "fallback"),
        ("-rf", "rf"),
        ("a\x00b\\c", "a_b_c"),
        ("tëam", "t_am"),
        ("", "fallback"),
        (None, "fallback"),
        ("x" * 500, "x" * safepaths.NAME_MAX),
    ],
)
def test_safe_name_keeps_only_plain_ascii_and_never_a_dot_name(raw, safe):
    assert safe_name(raw, "fallback") == safe
    assert check_name(safe) == safe


@pytest.mark.parametrize("bad", ["..", ".", ".hidden", "a/b", "/abs", "a\\b", "", "a\x00", "x" * 300, 7])
def test_check_name_refuses_anything_but_one_plain_name(bad):
    with pytest.raises(UnsafePath):
        check_name(bad)


@pytest.mark.parametrize("bad", ["7", "../x", True, -1, 1.0, None])
def test_record_id_takes_only_a_catalog_id(bad):
    with pytest.raises(UnsafeAnswer):
        record_id(bad, "the engine")
    assert record_id(7, "the engine") == 7


def test_inside_resolves_the_folder_but_not_the_last_name(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out" / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert inside(tmp_path / "out", tmp_path / "out" / "a" / "b.plan") == tmp_path / "out" / "a" / "b.plan"
    for bad in (tmp_path / "out" / ".." / "x", tmp_path / "out" / "link" / "x", tmp_path / "x", tmp_path / "out"):
        with pytest.raises(UnsafePath):
            inside(tmp_path / "out", bad)
    assert in_folder(tmp_path / "out", "e.plan") == tmp_path / "out" / "e.plan"
    with pytest.raises(UnsafePath):
        in_folder(tmp_path / "out", "../e.plan")


def test_every_format_the_farm_takes_has_a_scratch_name_and_no_other_does():
    assert tuple(UPLOAD_FILES) == FORMATS
    for fmt, name in UPLOAD_FILES.items():
        assert upload_name({"id": 1, "format": fmt}) == check_name(name)
    for fmt in ("x/../../pwned", "../onnx", "ONNX", "", None, ["onnx"]):
        with pytest.raises(UnsafeAnswer, match="nothing was written"):
            upload_name({"id": 1, "format": fmt})
    with pytest.raises(UnsafeAnswer):
        upload_name({"id": "../7", "format": "onnx"})


def test_default_name_is_strict_whatever_the_record_says():
    name = default_name({"model_name": "../../m", "target": "/etc/x", "backend": "../onnxruntime"})
    assert check_name(name) == name and name.endswith(".plan")
    assert default_name({"model_name": "m", "target": "onnxruntime/cpu-x86_64", "backend": "onnxruntime"}) == (
        "m-onnxruntime-cpu-x86_64.onnx"
    )


def test_a_link_at_the_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "out").mkdir()
    monkeypatch.setattr(safepaths.secrets, "token_hex", lambda n: "fixed")
    (tmp_path / "out" / ".e.plan.tmp-fixed").symlink_to(victim)
    with pytest.raises(FileExistsError), atomic_write(tmp_path / "out" / "e.plan", None, ".e.plan.tmp-") as out:
        out.write(b"payload")
    assert victim.read_text() == "mine" and sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        ".e.plan.tmp-fixed"
    ]


@pytest.mark.parametrize(
    ("expected", "size", "message"),
    [("0" * 64, None, "wrote sha256"), (None, 3, "wrote 7 bytes, expected 3")],
)
def test_a_write_that_is_not_what_was_expected_leaves_nothing(tmp_path, expected, size, message):
    dest = tmp_path / "e.plan"
    dest.write_bytes(b"previous")
    with pytest.raises(IntegrityError, match=message), atomic_write(dest, expected, size=size) as out:
        out.write(b"payload")
    assert [p.name for p in tmp_path.iterdir()] == ["e.plan"] and dest.read_bytes() == b"previous"


def test_verify_sees_the_bytes_before_they_take_the_name(tmp_path):
    def refuse(path: Path) -> None:
        assert path.read_bytes() == b"payload" and path.name.startswith(".tmp-")
        raise IntegrityError("not what the record says")

    with (
        pytest.raises(IntegrityError, match="record says"),
        atomic_write(tmp_path / "e.plan", None, verify=refuse) as out,
    ):
        out.write(b"payload")
    assert list(tmp_path.iterdir()) == []


def test_write_text_replaces_a_link_and_refuses_to_append_through_one(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "out").mkdir()
    report, summary = tmp_path / "out" / "junit.xml", tmp_path / "out" / "summary.md"
    report.symlink_to(victim)
    summary.symlink_to(victim)
    write_text(report, "<testsuites/>")
    assert not report.is_symlink() and report.read_text() == "<testsuites/>"
    with pytest.raises(UnsafePath, match="symbolic link"):
        write_text(summary, "| table |", append=True)
    assert victim.read_text() == "mine" and summary.is_symlink()
    write_text(tmp_path / "out" / "plain.md", "a", append=True)
    write_text(tmp_path / "out" / "plain.md", "b", append=True)
    assert (tmp_path / "out" / "plain.md").read_text() == "ab"
    assert sorted(os.listdir(tmp_path / "out")) == ["junit.xml", "plain.md", "summary.md"]
