"""An unknown trtexec flag is named with the nearest one the farm takes, as the CLI's own options are."""

from __future__ import annotations

import pytest

from enginefarm.core.trtexec import spec_from_trtexec


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("--fp61", "--fp16"), ("--shaeps=x:1x3", "--shapes"), ("--optShape=x:1", "--optShapes"), ("--int9", "--int8")],
)
def test_a_misspelt_flag_says_which_it_resembles(typed, meant):
    with pytest.raises(ValueError) as exc:
        spec_from_trtexec(typed)
    assert str(exc.value) == f"{typed}: not a trtexec build flag the farm takes; did you mean {meant}?"


def test_a_flag_like_none_gets_no_guess():
    with pytest.raises(ValueError) as exc:
        spec_from_trtexec("--verbose")
    assert "did you mean" not in str(exc.value)
