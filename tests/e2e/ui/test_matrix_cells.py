"""The build matrix keeps every engine of a target: an fp32 and an fp16 engine of sm86 are two cells, and two specs
of one precision are two more; the engine page names the runtime it was built with. Debian's Chromium under
Playwright against the session farm (uvicorn, Celery workers, PostgreSQL, Redis, SeaweedFS)."""

from __future__ import annotations

import re

import pytest

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec, save_conv_net
from tests.browser import launch_chromium
from tests.e2e.ui.test_dashboard import sign_in
from tests.helpers import unique_name

SM86 = "tensorrt-rtx/sm86"
CPU = "onnxruntime/cpu-x86_64"
NARROW = {"profiles": [{"input": {"min": [1, 3, 32, 32], "opt": [2, 3, 32, 32], "max": [2, 3, 32, 32]}}]}


@pytest.fixture(scope="module")
def three_ways(farm, tmp_path_factory):
    """A model built for sm86 in fp32 (with the CPU), in fp16, and in fp16 again with a narrower profile; returns
    (model, {"fp32"|"fp16"|"fp16-narrow"|"cpu": engine})."""
    path = save_conv_net(tmp_path_factory.mktemp("matrix") / "m.onnx", seed=614)
    engines = {}
    with Client(farm.url) as c:
        model, _ = c.upload(path, unique_name("matrix"))
        for kind, spec, targets in (
            ("fp32", sample_spec(), [SM86, CPU]),
            ("fp16", {**sample_spec(), "precision": "fp16"}, [SM86]),
            ("fp16-narrow", {**NARROW, "precision": "fp16"}, [SM86]),
        ):
            done = c.wait_build(c.build(model["id"], targets, spec)["id"], timeout=300, poll=0.2)
            assert {t["state"] for t in done["tasks"]} == {"succeeded"}, done["tasks"]
            for t in done["tasks"]:
                engines["cpu" if t["target"] == CPU else kind] = c.get(f"/v1/engines/{t['engine_id']}")
    return model, engines


@pytest.fixture(scope="module")
def page(farm):
    with launch_chromium() as chromium:
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        sign_in(page, farm, farm.token)
        yield page
        context.close()


def test_one_cell_per_target_precision_and_spec(farm, three_ways, page):
    model, engines = three_ways
    page.goto(f"{farm.url}/ui/models/{model['id']}")
    page.wait_for_selector("#matrix[data-live='false']", timeout=120_000)
    cells = page.locator(f"td.cell[data-target='{SM86}']")
    assert cells.count() == 3
    shown = {
        (cells.nth(i).get_attribute("data-precision"), cells.nth(i).get_attribute("data-spec")): int(
            re.search(r"engine (\d+)", cells.nth(i).inner_text())[1]
        )
        for i in range(cells.count())
    }
    # fp32 was built one way: one column, no spec; fp16 two ways: a column for each spec.
    assert shown == {
        ("fp32", None): engines["fp32"]["id"],
        ("fp16", engines["fp16"]["spec_hash"]): engines["fp16"]["id"],
        ("fp16", engines["fp16-narrow"]["spec_hash"]): engines["fp16-narrow"]["id"],
    }
    heads = page.locator(f"#matrix th[data-target='{SM86}']")
    assert sorted(heads.evaluate_all("els => els.map(e => e.dataset.precision)")) == ["fp16", "fp16", "fp32"]
    labels = " ".join(heads.all_inner_texts())
    assert engines["fp16"]["spec_hash"][:8] in labels and engines["fp16-narrow"]["spec_hash"][:8] in labels
    assert page.locator(f"td.cell[data-target='{CPU}'][data-precision='fp32']").count() == 1


def test_the_engine_page_names_its_runtime(farm, three_ways, page):
    _, engines = three_ways
    page.goto(f"{farm.url}/ui/engines/{engines['fp16']['id']}")
    assert page.inner_text("#engine-runtime") == f"TensorRT-RTX {engines['fp16']['backend_version']}"
    assert "TensorRT\n" not in page.inner_text(".facts") and "TensorRT\t" not in page.inner_text(".facts")
    page.goto(f"{farm.url}/ui/engines/{engines['cpu']['id']}")
    assert page.inner_text("#engine-runtime") == f"ONNX Runtime {engines['cpu']['backend_version']}"


def test_a_pending_gpu_cell_says_how_to_measure_it_then_shows_the_fleets_figure(farm, dist_settings, three_ways, page):
    """The sm86 cell waits for a GPU this farm lacks: it names the command that measures it on such a machine; once
    two machines of that class posted, it shows their median."""
    from server.embedded import issue_token

    model, engines = three_ways
    cell = f"td.cell[data-target='{SM86}'][data-precision='fp32']"
    page.goto(f"{farm.url}/ui/models/{model['id']}")
    page.wait_for_selector("#matrix[data-live='false']", timeout=120_000)
    engine_id = engines["fp32"]["id"]
    assert page.inner_text(f"{cell} [data-measure]") == (
        f"measure it on such a machine: enginefarm measure --engine {engine_id}"
    )
    assert page.locator(f"{cell} [data-fleet]").count() == 0
    rtx = engines["fp32"]["trt_version"]
    machine = {"gpu_name": "NVIDIA GeForce RTX 3090", "compute_capability": "8.6", "platform": "x86_64"}
    token = issue_token(dist_settings, "matrix-device", ["measure"])
    with Client(farm.url, token=token) as c:
        for i, ms in enumerate((2.0, 3.0)):
            body = {"machine_id": f"rtx-{i:06d}", "machine": {**machine, "trt_rtx_version": rtx}}
            body |= {"runtime": "tensorrt-rtx", "runtime_version": rtx, "median_ms": ms}
            r = c.http.post(f"/v1/engines/{engine_id}/measurements", json=body)
            assert r.status_code == 201, r.text
    page.reload()
    page.wait_for_selector("#matrix[data-live='false']", timeout=120_000)
    assert page.inner_text(f"{cell} [data-fleet]") == "fleet p50 2.5 ms on 2 machines of class NVIDIA GeForce RTX 3090"

    # A third machine checks it against the farm's reference outputs and finds it failing: the engine page shows
    # the failure at once, though this project's spec does not take fleet checks as verdicts.
    with Client(farm.url, token=token) as c:
        ref = c.get(f"/v1/engines/{engine_id}/reference")
        bad = {"passed": False, "outputs": {"output": {"violations": 0.5, "max_abs": 2.0}}, "reference": ref["sha256"]}
        body = {"machine_id": "rtx-000009", "machine": {**machine, "trt_rtx_version": rtx}, "accuracy": bad}
        body |= {"runtime": "tensorrt-rtx", "runtime_version": rtx, "median_ms": 2.6}
        r = c.http.post(f"/v1/engines/{engine_id}/measurements", json=body)
        assert r.status_code == 201, r.text
    page.goto(f"{farm.url}/ui/engines/{engine_id}")
    assert page.inner_text("#fleet-failed").startswith("1 check by the fleet failed: machine rtx-000009 (NVIDIA")
    rows = page.locator("#fleet tbody tr")
    assert rows.count() == 3 and "fail" in rows.nth(0).inner_text() and "2.600 ms" in rows.nth(0).inner_text()
    assert "p50 2.600 ms on 3 machines of class NVIDIA GeForce RTX 3090" in page.inner_text("#fleet-classes")
    assert page.inner_text("#measure-command").startswith(f"enginefarm measure --engine {engine_id} --api http")
    assert page.locator("#verdict-source").count() == 0  # shown, not taken as the verdict
    # The report's chart gets a series of the fleet's figures, and its table a column.
    page.goto(f"{farm.url}/ui/models/{model['id']}/report")
    page.wait_for_selector("#latency-figure[data-series]", timeout=30_000)
    assert page.get_attribute("#latency-figure", "data-series").split("|")[-1] == "p50 measured on the fleet"
    fleet_cells = [t.strip() for t in page.locator("#report-table td.fleet").all_inner_texts()]
    assert [c.splitlines() for c in fleet_cells if c != "–"] == [  # the GPU model's class first, as resolve ranks
        ["2.600 ms on 3 machines of class NVIDIA GeForce RTX 3090", "2.600 ms on 3 machines of compute capability 8.6"]
    ]
