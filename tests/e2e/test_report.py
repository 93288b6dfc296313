"""Rendering a model's benchmark report: the rich tables and the PNG chart."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure
from rich.console import Console

from enginefarm.client import report as rep
from enginefarm.client.report import fmt_ms, human_bytes, plot_report, regression_table, report_table

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PENDING_DETAIL = "benchmark pending: no worker with an sm86 GPU"
FAILED_DETAIL = "benchmark failed: CUDA out of memory at batch=32"


def stats(median: float, p99: float | None = None, count: int = 200) -> dict[str, float]:
    p99 = median * 1.3 if p99 is None else p99
    return {
        "min": median * 0.9,
        "mean": median * 1.02,
        "median": median,
        "p90": median * 1.1,
        "p95": median * 1.2,
        "p99": p99,
        "max": p99 * 1.1,
        "count": count,
    }


def measured(
    engine_id: int,
    target: str,
    batch: int,
    median: float,
    *,
    variant: str = "fp16",
    best: bool | None = None,
    device: str = "NVIDIA A10",
    p99: float | None = None,
    regression: dict[str, Any] | None = None,
    cosine: float = 0.999987,
    size: int = 5_400_000,
) -> dict[str, Any]:
    return {
        "engine_id": engine_id,
        "target": target,
        "backend": target.split("/")[0],
        "precision": "fp16",
        "spec_hash": f"{engine_id:04x}" * 16,
        "variant": variant,
        "best": best,
        "size": size,
        "shape_key": f"batch={batch}",
        "batch": batch,
        "device": device,
        "status": "measured",
        "detail": None,
        "latency_ms": stats(median, p99),
        "compute_ms": stats(median * 0.8),
        "h2d_ms": stats(median * 0.1),
        "d2h_ms": stats(median * 0.05),
        "throughput_qps": 1000.0 / median * batch,
        "accuracy": {
            "pass": True,
            "metrics": {"max_abs": 3.1e-3, "mean_abs": 2.5e-4, "rel_l2": 1e-3, "cosine": cosine},
            "limits": {"cosine": 0.999},
            "reference": "onnxruntime fp32",
        },
        "regression": regression,
    }


def unmeasured(engine_id: int, target: str, status: str, detail: str) -> dict[str, Any]:
    row = measured(engine_id, target, 1, 1.0)
    row.update(
        status=status,
        detail=detail,
        shape_key="opt",
        batch=None,
        device=None,
        latency_ms=None,
        compute_ms=None,
        h2d_ms=None,
        d2h_ms=None,
        throughput_qps=None,
        accuracy=None,
    )
    return row


def make_report() -> dict[str, Any]:
    """resnet v2 on three targets: batches 1/8/32, a sweep with a best variant, a pending and a failed engine."""
    faster = {
        "previous_engine_id": 5,
        "median_ms": 1.35,
        "median_ms_delta": -0.15,
        "median_ratio": 1.2 / 1.35,
        "p99_ms_delta": -0.2,
        "throughput_delta": 92.6,
        "size_delta": -20480,
        "cosine_delta": 2e-6,
    }
    slower = {
        "previous_engine_id": 6,
        "median_ms": 4.2,
        "median_ms_delta": 0.6,
        "median_ratio": 4.2 / 3.6,
        "p99_ms_delta": 0.9,
        "throughput_delta": -317.5,
        "size_delta": 1_048_576,
        "cosine_delta": -1.5e-5,
    }
    rows = [
        measured(7, "tensorrt/sm86", 1, 1.2, p99=1.734, regression=faster),
        measured(7, "tensorrt/sm86", 8, 4.2, regression=slower),
        measured(7, "tensorrt/sm86", 32, 15.8),
        # A sweep on sm89: two variants, the int8 one chosen.
        measured(8, "tensorrt/sm89", 1, 0.9, variant="fp16 opt3", best=False, device="NVIDIA L4"),
        measured(8, "tensorrt/sm89", 8, 3.1, variant="fp16 opt3", best=False, device="NVIDIA L4"),
        measured(9, "tensorrt/sm89", 1, 0.6, variant="int8 opt5", best=True, device="NVIDIA L4"),
        measured(9, "tensorrt/sm89", 8, 2.2, variant="int8 opt5", best=True, device="NVIDIA L4"),
        unmeasured(10, "tensorrt-rtx/sm86", "pending", PENDING_DETAIL),
        unmeasured(11, "tensorrt/sm90", "failed", FAILED_DETAIL),
    ]
    return {
        "model": {"id": 3, "name": "resnet", "version": "2", "sha256": "f" * 64},
        "previous": {"id": 2, "name": "resnet", "version": "1"},
        "rows": rows,
    }


def render(table) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(table)
    return console.export_text()


def line_with(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    assert lines, f"{needle!r} not in:\n{text}"
    return lines[0]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    return struct.unpack(">II", data[16:24])


# ------------------------------------------------------------------------------ helpers


def test_formatting_helpers() -> None:
    assert fmt_ms(1.2346) == "1.235"
    assert fmt_ms(15.8) == "15.80"
    assert fmt_ms(123.45) == "123.5"
    assert fmt_ms(0.01234) == "0.0123"
    assert fmt_ms(None) == "—"
    assert fmt_ms(-0.15, signed=True) == "-0.150"
    assert fmt_ms(0.6, signed=True) == "+0.600"
    assert human_bytes(512) == "512 B"
    assert human_bytes(2048) == "2.0 KiB"
    assert human_bytes(5_400_000) == "5.1 MiB"
    assert human_bytes(3 * 1024**3) == "3.0 GiB"
    assert human_bytes(-20480, signed=True) == "-20.0 KiB"
    assert human_bytes(1_048_576, signed=True) == "+1.0 MiB"
    assert human_bytes(0, signed=True) == "0 B"


# ------------------------------------------------------------------------------ report table


def test_report_table_cells() -> None:
    text = render(report_table(make_report()))
    assert text.lstrip().startswith("resnet version 2")
    for header in (
        "target",
        "variant",
        "shape",
        "device",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "qps",
        "accuracy",
        "size",
        "status",
    ):
        assert header in text

    batch1 = line_with(text, "batch 1")  # first batch-1 row: sm86, p50 1.2, p99 1.734
    assert "tensorrt/sm86" in batch1 and "NVIDIA A10" in batch1
    assert "1.200" in batch1 and "1.320" in batch1 and "1.734" in batch1
    assert "833.3" in batch1  # 1000 / 1.2 ms
    assert "PASS" in batch1 and "0.999987" in batch1 and "2.50e-04" in batch1
    assert "5.1 MiB" in batch1 and "measured" in batch1

    assert "15.80" in line_with(text, "batch 32")
    assert "★" in line_with(text, "int8 opt5")
    assert "★" not in line_with(text, "fp16 opt3")

    pending = line_with(text, "tensorrt-rtx/sm86")
    assert PENDING_DETAIL in pending and "PASS" not in pending
    assert FAILED_DETAIL in line_with(text, "tensorrt/sm90")


def test_report_table_accuracy_fail_and_missing_values() -> None:
    report = make_report()
    report["rows"][0]["accuracy"]["pass"] = False
    report["rows"][0]["accuracy"]["metrics"]["cosine"] = 0.981
    report["rows"][1]["throughput_qps"] = None
    text = render(report_table(report))
    first = line_with(text, "batch 1")
    assert "FAIL" in first and "0.981000" in first
    assert "—" in line_with(text, "batch 8")


def test_report_table_without_rows() -> None:
    report = make_report()
    report["rows"] = []
    table = report_table(report)
    assert table.row_count == 0
    assert "resnet version 2" in render(table)


# ------------------------------------------------------------------------------ regression table


def test_regression_table_shows_deltas_and_signs() -> None:
    table = regression_table(make_report())
    assert table is not None and table.row_count == 2
    text = render(table)
    assert "resnet version 2 vs version 1" in text

    faster = line_with(text, "batch 1")
    assert "1.350 → 1.200" in faster
    assert "-0.150" in faster and "-11.1 %" in faster
    assert "-0.200" in faster and "+92.6" in faster and "-20.0 KiB" in faster and "+2.00e-06" in faster

    slower = line_with(text, "batch 8")
    assert "3.600 → 4.200" in slower
    assert "+0.600" in slower and "+16.7 %" in slower
    assert "+0.900" in slower and "-317.5" in slower and "+1.0 MiB" in slower and "-1.50e-05" in slower


def test_regression_table_colours() -> None:
    report = make_report()
    # A slowdown within 5 % is neither green nor red.
    report["rows"][2]["regression"] = {
        "previous_engine_id": 4,
        "median_ms": 15.8,
        "median_ms_delta": 0.3,
        "median_ratio": 15.8 / 15.5,
    }
    table = regression_table(report)
    assert table is not None
    delta_cells = table.columns[4]._cells
    assert [cell.style for cell in delta_cells] == ["green", "red", ""]
    percent_cells = table.columns[5]._cells
    assert [cell.style for cell in percent_cells] == ["green", "red", ""]
    assert str(percent_cells[2]) == "+1.9 %"


def test_regression_table_none_without_previous_or_regressions() -> None:
    report = make_report()
    report["previous"] = None
    assert regression_table(report) is None

    report = make_report()
    for row in report["rows"]:
        row["regression"] = None
    assert regression_table(report) is None


# ------------------------------------------------------------------------------ chart


def test_plot_report_writes_png(tmp_path: Path) -> None:
    out = plot_report(make_report(), tmp_path / "resnet-2.png")
    assert out == tmp_path / "resnet-2.png"
    width, height = png_size(out)
    assert 600 <= width <= 4000 and 400 <= height <= 3000
    assert out.stat().st_size > 5_000
    assert [p.name for p in tmp_path.iterdir()] == ["resnet-2.png"]  # no temp file left behind

    small = plot_report(make_report(), tmp_path / "small.png", dpi=60)
    assert png_size(small)[0] < width


def test_plot_report_png_changes_with_data(tmp_path: Path) -> None:
    first = plot_report(make_report(), tmp_path / "a.png")
    changed = make_report()
    changed["rows"][2]["latency_ms"] = stats(31.0, 40.0)
    second = plot_report(changed, tmp_path / "b.png")
    assert first.read_bytes() != second.read_bytes()


def test_plotted_groups_draw_every_variant_and_star_the_best() -> None:
    """The int8 variant the web report shows is drawn too, beside its fp16 sibling; the chosen one has the star."""
    groups = rep._plotted_groups(make_report()["rows"])
    assert [label for label, _ in groups] == [
        "tensorrt/sm86",
        "tensorrt/sm89 · fp16 opt3",
        f"tensorrt/sm89 · int8 opt5 {rep.BEST_MARK}",
    ]
    assert [{row["variant"] for row in rows} for _, rows in groups[1:]] == [{"fp16 opt3"}, {"int8 opt5"}]

    report = make_report()
    for row in report["rows"]:
        row["best"] = None
    labels = [label for label, _ in rep._plotted_groups(report["rows"])]
    assert labels == ["tensorrt/sm86", "tensorrt/sm89 · fp16 opt3", "tensorrt/sm89 · int8 opt5"]
    assert rep._shape_order(rep._plotted_groups(report["rows"])) == ["batch 1", "batch 8", "batch 32"]


def test_plot_draws_a_bar_for_every_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[list[str]] = []
    original = Figure.savefig

    def spy(self: Figure, *args: Any, **kwargs: Any) -> None:
        drawn.append([t.get_text() for t in self.axes[0].get_xticklabels()])
        original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    plot_report(make_report(), tmp_path / "variants.png")
    (ticks,) = drawn
    assert len(ticks) == 3 and any("int8 opt5" in t for t in ticks) and any("fp16 opt3" in t for t in ticks)


def test_plot_report_log_axis_for_wide_spans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scales: list[str] = []
    original = Figure.savefig

    def spy(self: Figure, *args: Any, **kwargs: Any) -> None:
        scales.append(self.axes[0].get_yscale())
        original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    plot_report(make_report(), tmp_path / "linear.png")
    wide = make_report()
    wide["rows"][2]["latency_ms"] = stats(250.0, 400.0)  # 0.6 ms .. 400 ms
    plot_report(wide, tmp_path / "log.png")
    assert scales == ["linear", "log"]


def test_plot_report_nothing_measured(tmp_path: Path) -> None:
    report = make_report()
    report["rows"] = [row for row in report["rows"] if row["status"] != "measured"]
    with pytest.raises(ValueError, match="nothing measured yet") as excinfo:
        plot_report(report, tmp_path / "none.png")
    message = str(excinfo.value)
    assert "resnet version 2" in message and "1 pending" in message and "1 failed" in message
    assert PENDING_DETAIL in message

    report["rows"] = []
    with pytest.raises(ValueError, match="nothing measured yet: resnet version 2 has no engines"):
        plot_report(report, tmp_path / "none.png")
    assert list(tmp_path.iterdir()) == []


def test_plot_report_failed_write_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "chart.png"
    target.write_bytes(b"previous chart")

    def broken_savefig(self: Figure, fh: Any, *args: Any, **kwargs: Any) -> None:
        fh.write(PNG_SIGNATURE + b"half a chart")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="No space left"):
        plot_report(make_report(), target)
    assert [p.name for p in tmp_path.iterdir()] == ["chart.png"]
    assert target.read_bytes() == b"previous chart"

    monkeypatch.undo()
    fresh = tmp_path / "fresh.png"
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("rename failed")))
    with pytest.raises(OSError, match="rename failed"):
        plot_report(make_report(), fresh)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chart.png"]


def test_status_cell_names_the_status_once() -> None:
    report = make_report()
    report["rows"][-1]["detail"] = "TensorRT build error: unsupported op"
    text = render(report_table(report))
    assert "pending: benchmark pending" not in text
    assert PENDING_DETAIL in text
    assert "failed: TensorRT build error: unsupported op" in text


def test_two_specs_under_one_label_are_told_apart_by_their_spec():
    """Two int8 builds of one target with other shapes both read "int8 opt3": the report named them alike."""
    from api.services.reports import distinguish_variants

    rows = [
        {"target": "onnxruntime/cpu-x86_64", "variant": "int8 opt3", "spec_hash": "a" * 64},
        {"target": "onnxruntime/cpu-x86_64", "variant": "int8 opt3", "spec_hash": "b" * 64},
        {"target": "onnxruntime/cpu-x86_64", "variant": "int8 opt3", "spec_hash": "b" * 64},  # a second shape row
        {"target": "tensorrt-rtx/sm86", "variant": "int8 opt3", "spec_hash": "a" * 64},
        {"target": "onnxruntime/cpu-x86_64", "variant": "fp32 opt3", "spec_hash": "c" * 64},
    ]
    distinguish_variants(rows)
    assert [r["variant"] for r in rows] == [
        "int8 opt3 · spec aaaaaaaa",
        "int8 opt3 · spec bbbbbbbb",
        "int8 opt3 · spec bbbbbbbb",
        "int8 opt3",
        "fp32 opt3",
    ]


def test_a_task_answered_from_the_catalog_never_waited_a_negative_time():
    """`build` showed "wait s -0.00" for a reused task: started and queued are taken in one moment, in either order."""
    from datetime import datetime, timedelta, timezone

    from api.schemas.builds import TaskOut
    from storage.tables import BuildTaskRow

    queued = datetime(2026, 11, 27, tzinfo=timezone.utc)
    row = BuildTaskRow(
        id=1,
        target="onnxruntime/cpu-x86_64",
        state="succeeded",
        reused=True,
        attempts=0,
        queued_at=queued,
        started_at=queued - timedelta(microseconds=800),
        finished_at=queued,
    )
    assert TaskOut.of(row, None).wait_seconds == 0.0
