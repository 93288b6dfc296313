"""The accuracy limits docs/benchmarks.md tells users are the ones the code judges by."""

from __future__ import annotations

from pathlib import Path

from enginefarm.core.spec import DEFAULT_TOLERANCES

DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
COLUMNS = ("atol", "rtol", "violations", "cosine", "rel_l2", "agreement")


def documented() -> dict[str, dict[str, float]]:
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| precision | atol |"))
    table: dict[str, dict[str, float]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        precision, *cells = (c.strip() for c in line.strip("|").split("|"))
        table[precision] = {k: float(v) for k, v in zip(COLUMNS, cells, strict=True) if v != "—"}
    return table


def test_the_documented_limits_are_the_codes():
    assert documented() == DEFAULT_TOLERANCES
