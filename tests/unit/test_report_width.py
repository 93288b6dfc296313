"""`enginefarm report`'s table at a terminal's width: no line wider than the terminal, no number, shape range or engine
id broken across lines or cut short; what the width can't hold is left out whole and named under the table."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

from enginefarm.client.report import fmt_ms, fmt_qps, human_bytes, report_table

CPU = "CPU x86_64 (Intel(R) Xeon(R) Processor), 2 threads"
ESSENTIAL = ("target", "variant", "shape", "p50 ms", "p99 ms", "qps", "accuracy", "status")


def stats(median: float) -> dict[str, float]:
    return {"median": median, "p90": median * 1.4, "p99": median * 2.1}


def measured(engine_id: int, target: str, batch: int, median: float, device: str, **extra: Any) -> dict[str, Any]:
    return {
        "engine_id": engine_id,
        "target": target,
        "variant": "fp32 opt3",
        "best": None,
        "size": 80_197 + 1000 * engine_id,
        "profiles": [],
        "shape_key": f"batch={batch}",
        "batch": batch,
        "device": device,
        "status": "measured",
        "detail": None,
        "check": {"state": "succeeded", "detail": None},
        "latency_ms": stats(median),
        "throughput_qps": 1000.0 / median * batch,
        "accuracy": {"pass": True, "metrics": {"cosine": 0.9999871, "mean_abs": 1.78e-7 * batch}},
        **extra,
    }


def pending(engine_id: int, target: str, sm: str) -> dict[str, Any]:
    """A GPU engine no worker could measure, as the farm words it."""
    detail = (
        f"benchmark pending: no worker with an {sm} GPU and tensorrt_rtx; a machine that has one measures it with "
        f"`enginefarm measure --engine {engine_id}`"
    )
    return {
        "engine_id": engine_id,
        "target": target,
        "variant": "fp32 opt3",
        "best": None,
        "size": 512_556 + engine_id,
        "profiles": [{"input": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}}],
        "shape_key": None,
        "device": None,
        "status": "pending",
        "detail": detail,
        "latency_ms": None,
        "throughput_qps": None,
        "accuracy": None,
    }


def demo_report() -> dict[str, Any]:
    """The embedded demo's model (one CPU artifact measured at three batch sizes, four TensorRT-RTX engines waiting
    for a GPU) and two engines of a model with two inputs measured on GPUs."""
    rows = [measured(5, "onnxruntime/cpu-x86_64", b, m, CPU) for b, m in ((1, 0.2694), (4, 1.108), (8, 2.233))]
    rows += [pending(n, f"tensorrt-rtx/{sm}", sm) for n, sm in ((3, "sm120"), (2, "sm80"), (1, "sm86"), (4, "sm89"))]
    two_inputs = [
        {
            "images": {"min": [1, 3, 64, 64], "opt": [4, 3, 640, 640], "max": [16, 3, 1024, 1024]},
            "mask": {"min": [1, 1, 64, 64], "opt": [4, 1, 640, 640], "max": [16, 1, 1024, 1024]},
        }
    ]
    rows += [
        measured(6, "tensorrt/sm89", 16, 21.37, "NVIDIA GeForce RTX 4090", profiles=two_inputs),
        measured(7, "tensorrt/sm90", 16, 9.815, "NVIDIA H100 80GB HBM3", profiles=two_inputs, variant="int8 opt5"),
    ]
    return {"model": {"id": 1, "name": "convnet", "version": "1"}, "previous": None, "rows": rows}


def whole_values(row: dict[str, Any]) -> dict[str, list[str]]:
    """What each column shows of ``row`` that must stay on one line: numbers, shape ranges, the command to run."""
    values: dict[str, list[str]] = {"target": [row["target"]]}
    if row["status"] == "measured":
        latency = row["latency_ms"]
        values["p50 ms"] = [fmt_ms(latency["median"])]
        values["p90 ms"] = [fmt_ms(latency["p90"])]
        values["p99 ms"] = [fmt_ms(latency["p99"])]
        values["qps"] = [fmt_qps(row["throughput_qps"])]
        values["accuracy"] = ["0.999987", f"{row['accuracy']['metrics']['mean_abs']:.2e}"]
    else:
        values["status"] = [f"--engine {row['engine_id']}`"]
    values["size"] = [human_bytes(row["size"])]
    values["profiles"] = [
        f"{'x'.join(map(str, r['min']))}..{'x'.join(map(str, r['max']))}"
        for profile in row["profiles"]
        for r in profile.values()
    ]
    return values


def render(width: int) -> str:
    console = Console(file=io.StringIO(), record=True, width=width, color_system=None)
    console.print(report_table(demo_report()))
    return console.export_text()


@pytest.mark.parametrize("width", [100, 160, 220])
def test_report_fits_the_terminal_and_breaks_no_number(width: int) -> None:
    text = render(width)
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= width, text
    header = next(line for line in lines if "target" in line)
    for name in ESSENTIAL:
        assert name in header, f"{name!r} left out at {width} columns:\n{text}"
    caption = next((line for line in lines if "left out to fit" in line), "")
    for row in demo_report()["rows"]:
        for column, values in whole_values(row).items():
            if column in caption:  # left out whole, and said so
                continue
            assert column in header, f"{column!r} neither shown nor named as left out at {width} columns:\n{text}"
            for value in values:
                assert any(value in line for line in lines), f"{value!r} broken or cut at {width} columns:\n{text}"


def test_report_at_160_columns_keeps_the_device_and_each_command_whole() -> None:
    text = render(160)
    assert "device" in next(line for line in text.splitlines() if "target" in line)
    for engine_id in (1, 2, 3, 4):
        assert any(f"`enginefarm measure --engine {engine_id}`" in line for line in text.splitlines()), text


def test_a_row_measured_at_its_opt_shape_names_the_shape():
    """Two fixed-shape builds of one model (batch 8 and batch 1) both measured at "opt" read differently."""
    from enginefarm.client.report import shape_label

    eight = {"shape_key": "opt", "shapes": {"images": [8, 3, 640, 640]}}
    one = {"shape_key": "opt", "shapes": {"images": [1, 3, 640, 640]}}
    assert shape_label(eight) == "images 8x3x640x640" and shape_label(one) == "images 1x3x640x640"
    assert shape_label({"shape_key": "batch=4", "shapes": {"x": [4, 3]}}) == "batch 4"
    assert shape_label({"shape_key": "opt"}) == "opt"
