"""How the CLI names an engine in a list of reasons: two engines of one target differ in precision or version."""

from __future__ import annotations

from enginefarm.client.terminal import engine_words


def test_two_engines_of_one_target_read_differently():
    fp32 = {"engine_id": 3, "target": "tensorrt-rtx/sm86", "precision": "fp32", "reason": "cc 8.6, you have 9.0"}
    fp16 = {**fp32, "engine_id": 4, "precision": "fp16"}
    assert engine_words(fp32) == "engine 3 (tensorrt-rtx/sm86 fp32)"
    assert engine_words(fp16) == "engine 4 (tensorrt-rtx/sm86 fp16)"
    assert engine_words({**fp16, "model_version": "2"}) == "engine 4 (tensorrt-rtx/sm86 fp16, v2)"


def test_a_problem_without_an_engine_is_its_target():
    assert engine_words({"target": "tensorrt-rtx/sm75", "reason": "no worker"}) == "tensorrt-rtx/sm75"


def test_a_command_that_ends_itself_inside_a_farm_call_keeps_its_line_and_exit_code(capsys):
    """`measure` without its runtime's extra prints the pip line and exits 2 from inside ``farm_call``; the call
    must not turn that into a second line ("error: 2") and exit 1."""
    import pytest
    import typer

    from enginefarm.client.terminal import farm_call

    with pytest.raises(typer.Exit) as ended, farm_call("http://127.0.0.1:9"):
        raise typer.Exit(2)
    assert ended.value.exit_code == 2
    assert "error" not in capsys.readouterr().err
