"""The fleet's figures per device class (enginefarm.core.fleet) and how ranking uses them beside the farm's own
(enginefarm.core.choose): a machine counts once, the class figure is the median over machines, an outlier is
left out only where there is a majority to judge it by, and a farm figure and a fleet figure are never mixed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from enginefarm.core.choose import Evidence, Option, choose
from enginefarm.core.fleet import DeviceFigure, Measurement, class_figures, describe_class, outliers
from enginefarm.core.wanted import Wanted
from tests.unit.test_compat import rtx_engine, rtx_machine

GPU = "NVIDIA GeForce RTX 4090"


def fig(machine: str, ms: float, shapes: str = "{}", gpu: str | None = GPU, cc: str | None = "8.9") -> DeviceFigure:
    return DeviceFigure(machine, gpu, cc, None, shapes, ms)


def test_each_machine_counts_once_with_its_latest_figure():
    figures = class_figures([fig("a", 10.0), fig("b", 2.0), fig("a", 1.0), fig("c", 3.0)])
    gpu = figures[f"fleet:gpu:{GPU}"]
    assert (gpu.median_ms, gpu.machines, gpu.flagged) == (2.0, 3, [])
    assert figures["fleet:cc:8.9"].median_ms == 2.0


@pytest.mark.parametrize(
    ("figures", "flagged"),
    [
        ({"a": 1.0, "b": 1.1, "c": 0.1}, ["c"]),  # 10x fast
        ({"a": 1.0, "b": 1.1, "c": 1.2, "d": 6.0}, ["d"]),  # 5.2x slow
        ({"a": 1.0, "b": 1.1, "c": 4.9}, []),  # within 5x of the median
        ({"a": 1.0, "b": 100.0}, []),  # two machines: no majority to say which is off
    ],
)
def test_an_outlier_is_flagged_only_where_a_majority_can_tell(figures, flagged):
    assert outliers(figures) == flagged


def test_the_class_takes_the_shapes_most_machines_measured_at():
    a, b = '{"x":[1,3]}', '{"x":[8,3]}'
    figures = class_figures([fig("m1", 1.0, a), fig("m2", 8.0, b), fig("m3", 9.0, b)])
    gpu = figures[f"fleet:gpu:{GPU}"]
    assert (gpu.shapes, gpu.median_ms, gpu.machines) == (b, 8.5, 2)


def test_a_cpu_figure_stands_for_its_cpu():
    figures = class_figures([DeviceFigure("m", None, None, "Intel Core i7", "{}", 3.0)])
    assert list(figures) == ["fleet:cpu:Intel Core i7"]
    assert describe_class("fleet:cpu:Intel Core i7", 1) == "1 machine of the CPU Intel Core i7"


def option(name: str, precision: str, latencies: dict, machines: dict | None = None) -> Option:
    return Option(
        name, rtx_engine("sm89", precision=precision), 1, name * 64, Evidence(None, latencies, {}, machines or {})
    )


def test_ranking_uses_the_fleets_class_where_the_farm_measured_nothing_there():
    fleet = f"fleet:gpu:{GPU}"
    choice = choose(
        [option("a", "fp16", {fleet: 2.0}, {fleet: 3}), option("b", "fp32", {fleet: 1.0}, {fleet: 4})],
        rtx_machine(),
        Wanted(),
    )
    assert [j.option.id for j in choice.ranked] == ["b", "a"]
    assert choice.ranked_by.startswith(f"fastest measured on 4 machines of class {GPU}: "), choice.ranked_by
    assert "1 ms on 4 machines" in choice.ranked_by and "2 ms on 3 machines" in choice.ranked_by
    assert choice.ranked[0].option.evidence.latency_on == f"4 machines of class {GPU}"


def test_a_farm_figure_and_a_fleet_figure_are_never_mixed():
    """The farm measured both engines on the GPU model: it ranks them, and the fleet's figure of one engine (which
    would reverse the order) does not mix in."""
    farm, fleet = f"gpu:{GPU}", f"fleet:gpu:{GPU}"
    choice = choose(
        [option("a", "fp16", {farm: 1.0}), option("b", "fp32", {farm: 2.0, fleet: 0.5}, {fleet: 3})],
        rtx_machine(),
        Wanted(),
    )
    assert [j.option.id for j in choice.ranked] == ["a", "b"]
    assert choice.ranked_by.startswith(f"fastest measured on {GPU}: "), choice.ranked_by


def test_a_measurement_that_cannot_be_is_refused_by_its_type():
    base = {"machine_id": "machine-01", "machine": {}, "runtime": "onnxruntime", "runtime_version": "1.23.2"}
    assert Measurement(**base, median_ms=1.0, p99_ms=1.0).p99_ms == 1.0
    for bad in ({"median_ms": float("inf")}, {"median_ms": -1.0}, {"median_ms": 2.0, "p99_ms": 1.0}):
        with pytest.raises(ValidationError):
            Measurement(**base, **bad)
