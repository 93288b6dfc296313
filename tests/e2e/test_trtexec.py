"""trtexec's build flags as a spec (enginefarm build / ci take them as trtexec spells them)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from enginefarm.core.spec import BuildSpec
from enginefarm.core.trtexec import memory_mib, spec_from_trtexec


def test_a_trtexec_command_line_becomes_a_valid_spec():
    spec = spec_from_trtexec(
        "--fp16 --memPoolSize=workspace:4G --builderOptimizationLevel=5 "
        "--hardwareCompatibilityLevel=ampere+ --stronglyTyped --versionCompatible "
        "--timingCacheFile=/tmp/x.cache --minShapes=x:1x3x8x8 --optShapes=x:2x3x8x8 "
        "--maxShapes=x:4x3x8x8"
    )
    assert spec == {
        "precision": "fp16",
        "workspace_mib": 4096,
        "optimization_level": 5,
        "hardware_compatibility": "ampere_plus",
        "strongly_typed": True,
        "version_compatible": True,
        "timing_cache": True,
        "profiles": [{"x": {"min": [1, 3, 8, 8], "opt": [2, 3, 8, 8], "max": [4, 3, 8, 8]}}],
    }
    BuildSpec(**spec)  # every field it sets is one the spec has


@pytest.mark.parametrize(
    "flags,precision",
    [
        (["--fp16"], "fp16"),
        (["--fp16", "--int8"], "int8"),
        (["--best"], "int8"),
        (["--bf16", "--fp16"], "bf16"),
        (["--fp8", "--fp16"], "fp8"),
    ],
)
def test_the_lowest_precision_flag_wins_as_trtexec_enables_them_all(flags, precision):
    assert spec_from_trtexec(flags)["precision"] == precision


def test_values_may_follow_their_flag_after_a_space():
    assert spec_from_trtexec(["--shapes", "x:1x3x8x8", "--memPoolSize", "workspace:512"]) == {
        "shapes": {"x": [1, 3, 8, 8]},
        "workspace_mib": 512,
    }


@pytest.mark.parametrize("text,mib", [("4096", 4096), ("4096M", 4096), ("2G", 2048), ("2048K", 2), ("1.5G", 1536)])
def test_pool_sizes_read_as_trtexec_reads_them(text, mib):
    assert memory_mib(text) == mib


def test_every_flag_it_cannot_take_is_named_with_the_reason():
    with pytest.raises(ValueError) as exc:
        spec_from_trtexec(
            "--onnx=m.onnx --saveEngine=m.plan --plugins=libx.so --memPoolSize=dlaSRAM:1 "
            "--builderOptimizationLevel=9 --hardwareCompatibilityLevel=volta --noSuchFlag"
        )
    text = str(exc.value)
    for expected in (
        "--onnx: the model is the one uploaded",
        "--saveEngine: the farm stores the engine",
        "--plugins: the farm never loads plugin libraries",
        "only the workspace pool",
        "give a level from 0 to 5",
        "give none, ampere+ or sameComputeCapability",
        "--noSuchFlag: not a trtexec build flag",
    ):
        assert expected in text, text


@pytest.mark.parametrize("size", ["9" * 400, "9" * 300 + "G", "2048G", "1e9", "\u0669\u0669"])
def test_a_pool_size_past_any_workspace_is_refused_naming_the_flag(size):
    """400 digits once overflowed a float into an OverflowError: a 500 on the dashboard, a traceback in the CLI."""
    with pytest.raises(ValueError) as exc:
        spec_from_trtexec(f"--memPoolSize=workspace:{size}")
    assert str(exc.value).startswith("--memPoolSize=workspace:") and len(str(exc.value)) < 200, str(exc.value)


@pytest.mark.parametrize("level", ["3" * 5000, "\u00b2", "6", "-1"])
def test_an_optimization_level_outside_0_to_5_is_refused(level):
    with pytest.raises(ValueError, match="give a level from 0 to 5"):
        spec_from_trtexec(f"--builderOptimizationLevel={level}")


def test_the_cli_says_what_is_wrong_with_a_pool_size_in_one_line(tmp_path):
    """`enginefarm build --trtexec-args` with 400 digits: exit 1 and an error naming the flag, no traceback."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "enginefarm",
            "build",
            "1",
            "--target",
            "onnxruntime/cpu-x86_64",
            "--api",
            "http://127.0.0.1:9",
            "--trtexec-args",
            "--memPoolSize=workspace:" + "9" * 400,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 1, out.stdout + out.stderr
    said = " ".join(out.stderr.split())
    assert "Traceback" not in said and said.startswith("error: --memPoolSize=workspace:") and "not a size" in said, said


@pytest.mark.parametrize("item", ["x:[0,1e999]", "x:[-1e400,0]", "x:[nan,1]"])
def test_a_value_range_past_float_is_refused_on_the_command_line(item):
    from enginefarm.core.shapes import parse_val_ranges

    with pytest.raises(ValueError, match="must be finite numbers"):
        parse_val_ranges([item])


def test_the_cli_refuses_two_precisions_rather_than_dropping_one():
    """`enginefarm build --precision fp32 --fp16` built fp32 without a word: now exit 1 naming both, and the same
    precision twice is fine."""
    from enginefarm.client.ci import build_spec

    assert build_spec(None, "fp16", ["--fp16"]) == {"precision": "fp16"}
    code, said = _cli(
        "build", "1", "--target", "onnxruntime/cpu-x86_64", "--api", NOWHERE, "--precision", "fp32", "--fp16"
    )
    assert code == 1 and "Traceback" not in said, said
    assert "--precision fp32 and the trtexec flags (fp16) ask for two precisions" in said, said


NOWHERE = "http://127.0.0.1:9"  # no farm listens: these commands must stop before any request


def _cli(*args: str, env: dict[str, str] | None = None, cwd=None) -> tuple[int, str]:
    """``enginefarm ARGS`` as a user runs it: the exit code and its stderr, whitespace collapsed."""
    out = subprocess.run(
        [sys.executable, "-m", "enginefarm", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    return out.returncode, " ".join(out.stderr.split())


@pytest.mark.parametrize(
    "args, env, words",
    [
        (["ls", "models"], {"ENGINEFARM_API_URL": "127.0.0.1:8491"}, "needs its scheme: http://127.0.0.1:8491"),
        (
            ["fetch", "m", "--cc", "86", "--api", NOWHERE, "-o", "x.plan"],
            {},
            "compute_capability: a compute capability is major.minor, e.g. 8.6 (not 86 or sm86)",
        ),
    ],
    ids=["a farm URL without its scheme", "a compute capability without its dot"],
)
def test_the_cli_says_what_a_value_should_look_like(args, env, words, tmp_path):
    """Not "cannot reach the farm at ://" for a URL without http://, nor a regular expression for --cc 86."""
    code, said = _cli(*args, env=env, cwd=tmp_path)
    assert code == 1 and "Traceback" not in said and words in said, said
    assert not (tmp_path / "x.plan").exists()


@pytest.mark.parametrize("typed, meant", [("--precison", "--precision"), ("--waitt", "--wait"), ("--fp61", "--fp16")])
def test_a_misspelt_option_is_a_usage_error_naming_the_nearest(typed, meant):
    """`build --precison fp16` once read as two unknown trtexec flags (exit 1), `--waitt` as an "invalid value": a
    misspelt option, the command's own or a trtexec flag, is one usage error as click reports any (exit 2)."""
    code, said = _cli("build", "1", "--target", "onnxruntime/cpu-x86_64", "--api", NOWHERE, typed, "fp16")
    words = " ".join(said.replace("│", " ").split())
    assert code == 2 and f"No such option: {typed}" in words and f"Did you mean {meant}?" in words, said
