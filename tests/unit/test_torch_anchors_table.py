"""The GPU matrix's table against torch (bench/torch_anchors.py): what it compares, from a run's results.

The GPU run itself happens on a borrowed machine; this holds the table's arithmetic: the farm's best passing
artifact against the best torch.compile way, and against the best that passes the same gate.
"""

from __future__ import annotations

from bench.torch_anchors import against_torch


def _engine(id_: int, precision: str, default: float, chosen: str, chosen_ms: float, passes: bool) -> dict:
    choices = [{"session": "default", "median_ms": default}, {"session": chosen, "median_ms": chosen_ms}]
    return {
        "id": id_,
        "target": "onnxruntime/cuda-sm90",
        "precision": precision,
        "accuracy_pass": passes,
        "sessions": {"chosen": chosen, "choices": choices},
    }


def _results() -> dict:
    torch_rows = [
        {"way": "eager fp32", "batch": 8, "median_ms": 3.7, "gate": {"precision": "fp32", "pass": True}},
        {"way": "compile fp32", "batch": 8, "median_ms": 2.2, "gate": {"precision": "fp32", "pass": True}},
        {
            "way": "compile fp32 reduce-overhead",
            "batch": 8,
            "median_ms": 1.5,
            "gate": {"precision": "fp32", "pass": True},
        },
        {
            "way": "compile fp16 reduce-overhead",
            "batch": 8,
            "median_ms": 1.0,
            "gate": {"precision": "fp16", "pass": False, "failures": ["logits: violations 2% > 0.5%"]},
        },
    ]
    engines = {
        "1": _engine(1, "fp32", 2.2, "nhwc+graph", 1.6, True),
        "2": _engine(2, "fp16", 1.8, "nhwc+graph", 1.1, False),  # faster, but fails its gate: not handed out
    }
    return {"models": {"resnet50": {"torch": torch_rows, "engines": engines}}}


def test_the_ratios_take_the_best_passing_farm_artifact_and_both_torch_bests():
    table = against_torch(_results())
    row = next(line for line in table.splitlines() if line.startswith("| resnet50 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # The farm's fp16 (1.1 ms) fails its gate, so the farm's best is fp32's kept 1.6 ms: 1.6 / 1.0 against every
    # compile way, 1.6 / 1.5 against the fastest that passes the gate.
    assert cells[-3:] == ["1.60x", "1.07x", "fp32 pass, fp16 FAIL"]
    assert "1.000 (fails gate)" in cells
    assert "logits: violations 2% > 0.5%" in table


def test_a_way_missing_from_every_model_gets_no_column():
    header = next(line for line in against_torch(_results()).splitlines() if line.startswith("| model "))
    assert "max-autotune" not in header and "eager fp16" not in header
    assert "compile fp32 reduce-overhead" in header
