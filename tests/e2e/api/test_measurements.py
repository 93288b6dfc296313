"""The fleet's measurements (POST/GET /v1/engines/{id}/measurements): deploy machines post what they measured of
an engine, the resolver ranks that engine's class by the median over machines, an outlier is flagged and left out,
figures that cannot be are a 422, a project's devices never move another project's answer, and a token posts only
as fast as the farm allows. In process (TestClient) on PostgreSQL and SQLite, rows written as workers write them."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from enginefarm.core.config import Settings
from server.embedded import issue_token
from storage.db import session_scope
from storage.tables import BenchmarkRow
from tests.helpers import RTX_VERSION, catalog_engine, catalog_model, unique_name

GPU = "NVIDIA GeForce RTX 3090"
CPU_NAME = "AMD EPYC 7B13"
MACHINE = {"gpu_name": GPU, "compute_capability": "8.6", "trt_rtx_version": RTX_VERSION, "platform": "x86_64"}
QUERY = {"cc": "8.6", "trt_rtx": RTX_VERSION, "gpu": GPU, "platform": "x86_64"}


@pytest.fixture
def farm(catalog_settings):
    """An app on its own catalog with two projects: alpha's model has two sm86 engines (fp16, fp32) and the CPU
    artifact; beta uploaded the same bytes under its own name, so it sees the same engines."""
    settings: Settings = catalog_settings.model_copy(update={"measurements_per_minute_per_token": 10})
    sha = uuid.uuid4().hex * 2
    names = {"alpha": unique_name("fleet-a"), "beta": unique_name("fleet-b")}
    with TestClient(create_app(settings)) as http:
        with session_scope(settings) as s:
            models = {}
            for project, name in names.items():
                models[project] = catalog_model(s, name, sha)
                models[project].project = project
            alpha = models["alpha"]
            fp16 = catalog_engine(s, alpha, "sm86")
            fp32 = catalog_engine(s, alpha, "sm86", precision="fp32", spec_hash="1" * 64)
            cpu = catalog_engine(s, alpha, "cpu")
        tokens = {
            (project, scope): issue_token(settings, f"{project}-{scope}", [scope], project=project)
            for project in names
            for scope in ("read", "measure")
        }
        yield settings, http, names, {"fp16": fp16, "fp32": fp32, "cpu": cpu}, tokens


def as_token(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def figure(machine_id: str, ms: float, **machine) -> dict:
    return {
        "machine_id": machine_id,
        "machine": machine or MACHINE,
        "runtime": "tensorrt-rtx",
        "runtime_version": RTX_VERSION,
        "shapes": {"input": [4, 3, 32, 32]},
        "median_ms": ms,
        "p99_ms": ms * 1.2,
    }


def post(http, token: str, engine_id: int, body: dict):
    return http.post(f"/v1/engines/{engine_id}/measurements", json=body, headers=as_token(token))


def resolve(http, token: str, name: str) -> dict:
    r = http.get("/v1/resolve", params={**QUERY, "model": name}, headers=as_token(token))
    assert r.status_code == 200, r.text
    return r.json()


def test_the_fleets_figures_rank_its_class_and_an_outlier_is_left_out(farm):
    settings, http, names, engines, tokens = farm
    measure, read = tokens["alpha", "measure"], tokens["alpha", "read"]
    before = resolve(http, read, names["alpha"])
    assert "not every engine was measured" in before["ranked_by"], before["ranked_by"]
    # Three machines of the class measure both engines: fp32 is the faster here.
    for i, (fp16_ms, fp32_ms) in enumerate([(2.0, 1.0), (2.2, 1.1), (1.9, 1.2)]):
        assert post(http, measure, engines["fp16"], figure(f"machine-{i:04d}", fp16_ms)).status_code == 201
        assert post(http, measure, engines["fp32"], figure(f"machine-{i:04d}", fp32_ms)).status_code == 201
    answer = resolve(http, read, names["alpha"])
    assert answer["engine"]["id"] == engines["fp32"], answer
    assert f"fastest measured on 3 machines of class {GPU}" in answer["ranked_by"], answer["ranked_by"]
    assert "1.1 ms on 3 machines" in answer["ranked_by"] and "2 ms on 3 machines" in answer["ranked_by"]
    # The chosen engine's figures on this machine's classes, beside each other: here the fleet's only.
    assert [(m["source"], m["device_class"], m["latency_ms"], m["machines"]) for m in answer["measured"]] == [
        ("fleet", f"fleet:gpu:{GPU}", 1.1, 3),
        ("fleet", "fleet:cc:8.6", 1.1, 3),
    ]
    # A fourth machine claims fp16 runs in 0.01 ms, 200 times faster than its class: flagged, left out.
    r = post(http, measure, engines["fp16"], figure("hostile-0001", 0.01))
    assert r.status_code == 201 and r.json()["flagged"] is True, r.text
    again = resolve(http, read, names["alpha"])
    assert again["engine"]["id"] == engines["fp32"], again["ranked_by"]
    listed = http.get(f"/v1/engines/{engines['fp16']}/measurements", headers=as_token(read)).json()
    assert [m["flagged"] for m in listed["items"]] == [False, False, False, True]
    by_class = {c["device_class"]: c for c in listed["fleet"]}
    gpu = by_class[f"fleet:gpu:{GPU}"]
    assert (gpu["median_ms"], gpu["machines"], gpu["flagged"]) == (2.0, 3, ["hostile-0001"])
    assert by_class["fleet:cc:8.6"]["label"] == "3 machines of compute capability 8.6"
    # A machine counts once: its later figure replaces its earlier one.
    assert post(http, measure, engines["fp32"], figure("machine-0000", 3.0)).status_code == 201
    listed = http.get(f"/v1/engines/{engines['fp32']}/measurements", headers=as_token(read)).json()
    assert {c["device_class"]: c["median_ms"] for c in listed["fleet"]}[f"fleet:gpu:{GPU}"] == pytest.approx(1.2)


def test_the_farms_figures_and_the_fleets_are_listed_side_by_side(farm):
    settings, http, names, engines, tokens = farm
    with session_scope(settings) as s:
        s.add(
            BenchmarkRow(
                engine_id=engines["cpu"], project="alpha", cpu_name=CPU_NAME, median_ms=4.0, shapes={}, machine={}
            )
        )
    cpu_figure = figure("laptop-0001", 5.0, cpu_name="Intel Core i7-1185G7", platform="x86_64", **{"gpu_name": GPU})
    r = post(http, tokens["alpha", "measure"], engines["cpu"], {**cpu_figure, "runtime": "onnxruntime/cpu"})
    assert r.status_code == 201, r.text
    # The CPU artifact ran on the machine's CPU: it counts for that CPU's class, not for its GPU's.
    assert (r.json()["gpu_name"], r.json()["cpu_name"]) == (None, "Intel Core i7-1185G7")
    read = as_token(tokens["alpha", "read"])
    both = http.get(f"/v1/engines/{engines['cpu']}/measurements", headers=read).json()
    assert [(m["source"], m["median_ms"]) for m in both["items"]] == [("farm", 4.0), ("fleet", 5.0)]
    assert [c["device_class"] for c in both["fleet"]] == ["fleet:cpu:Intel Core i7-1185G7"]
    only = http.get(f"/v1/engines/{engines['cpu']}/measurements", params={"source": "fleet"}, headers=read).json()
    assert [m["source"] for m in only["items"]] == ["fleet"]
    bad = http.get(f"/v1/engines/{engines['cpu']}/measurements", params={"source": "lab"}, headers=read)
    assert bad.status_code == 422


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"median_ms": -1.0}, "median_ms"),
        ({"median_ms": 0}, "median_ms"),
        ({"p99_ms": 0.5}, "p99_ms 0.5 is below median_ms 1"),
        ({"machine": {**MACHINE, "compute_capability": "8.9"}}, "cannot have run on the machine"),
        ({"machine": {"gpu_name": GPU, "platform": "x86_64"}}, "has no compute_capability"),
        ({"machine_id": "a b"}, "machine_id"),
        ({"shapes": {"input": [0, 3]}}, "shapes"),
        ({"stats": {"mean_ms": -2.0}}, "stats"),
        ({"color": "red"}, "color"),
    ],
)
def test_figures_that_cannot_be_are_a_422_that_says_why(farm, change, says):
    settings, http, names, engines, tokens = farm
    r = post(http, tokens["alpha", "measure"], engines["fp16"], {**figure("machine-0001", 1.0), **change})
    assert r.status_code == 422, r.text
    assert says in r.text, r.text
    listed = http.get(f"/v1/engines/{engines['fp16']}/measurements", headers=as_token(tokens["alpha", "read"]))
    assert listed.json()["items"] == []  # nothing half-written


def test_nan_is_a_422(farm):
    settings, http, names, engines, tokens = farm
    body = '{"machine_id": "machine-0001", "machine": {"compute_capability": "8.6"}, "runtime": "x", '
    body += '"runtime_version": "1", "median_ms": NaN}'
    r = http.post(
        f"/v1/engines/{engines['fp16']}/measurements",
        content=body,
        headers={**as_token(tokens["alpha", "measure"]), "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text


def test_a_measure_token_measures_and_does_nothing_else(farm):
    settings, http, names, engines, tokens = farm
    measure = tokens["alpha", "measure"]
    r = post(http, tokens["alpha", "read"], engines["fp16"], figure("machine-0001", 1.0))
    assert r.status_code == 403 and "needs 'measure'" in r.json()["detail"], r.text
    assert http.get(f"/v1/engines/{engines['fp16']}", headers=as_token(measure)).status_code == 200
    r = http.post("/v1/builds", json={"model_id": 1, "targets": ["tensorrt-rtx/sm86"]}, headers=as_token(measure))
    assert r.status_code == 403 and "needs 'build'" in r.text, r.text


def test_another_projects_devices_never_move_this_projects_answer(farm):
    settings, http, names, engines, tokens = farm
    before = resolve(http, tokens["alpha", "read"], names["alpha"])
    # beta sees the same bytes, so it may measure them: for beta.
    for i in range(3):
        assert post(http, tokens["beta", "measure"], engines["fp32"], figure(f"beta-{i:04d}", 0.5)).status_code == 201
        assert post(http, tokens["beta", "measure"], engines["fp16"], figure(f"beta-{i:04d}", 5.0)).status_code == 201
    after = resolve(http, tokens["alpha", "read"], names["alpha"])
    assert (after["engine"]["id"], after["ranked_by"]) == (before["engine"]["id"], before["ranked_by"])
    alpha_view = http.get(f"/v1/engines/{engines['fp32']}/measurements", headers=as_token(tokens["alpha", "read"]))
    assert alpha_view.json()["items"] == []
    beta = resolve(http, tokens["beta", "read"], names["beta"])
    assert beta["engine"]["id"] == engines["fp32"] and "3 machines" in beta["ranked_by"], beta["ranked_by"]
    # An engine of bytes beta never uploaded is not beta's to measure: it does not exist for beta.
    with session_scope(settings) as s:
        other = catalog_model(s, unique_name("fleet-c"), uuid.uuid4().hex * 2)
        other.project = "alpha"
        alpha_only = catalog_engine(s, other, "sm86")
    r = post(http, tokens["beta", "measure"], alpha_only, figure("beta-0001", 1.0))
    assert r.status_code == 404, r.text


def test_a_token_posts_only_as_fast_as_the_farm_allows(farm):
    settings, http, names, engines, tokens = farm
    measure = tokens["alpha", "measure"]
    codes = [post(http, measure, engines["fp16"], figure(f"machine-{i:04d}", 1.0)).status_code for i in range(11)]
    assert codes == [201] * 10 + [429], codes
    r = post(http, measure, engines["fp16"], figure("machine-0099", 1.0))
    assert r.status_code == 429 and r.headers["Retry-After"] == "60", r.headers
    # Another token of the same project has its own allowance.
    other = issue_token(settings, "alpha-measure-2", ["measure"], project="alpha")
    assert post(http, other, engines["fp16"], figure("machine-0100", 1.0)).status_code == 201
