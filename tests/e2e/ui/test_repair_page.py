"""The int8 accuracy repair in the dashboard, in a real browser (Debian's Chromium under Playwright) against the session
farm: a model with one layer whose range int8 cannot hold, built int8 with ``accuracy_repair`` for the CPU. Its engine
page and its model's report draw the ranking by measured sensitivity (ONNX node names, the kept layer in its own
colour) with the cosine before and after, the failed original kept as a variant, the CPU latency of fp32 / int8
without repair / int8 repaired from one run, and (int8 being slower on this tiny network) the speed stop;
GET /v1/engines/{id}/int8 and the report's ``int8`` carry the same facts (documented in OpenAPI); an int8 engine built
without repair shows nothing of it."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from enginefarm.client import Client
from enginefarm.graph.samples import sample_spec
from tests.browser import launch_chromium
from tests.e2e.ui.test_dashboard import DESKTOP, sign_in
from tests.helpers import unique_name
from tests.unit.worker.test_int8_vs_fp32 import _wide_add

CPU = "onnxruntime/cpu-x86_64"
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}
KEPT_COLOUR = (0xE3, 0x62, 0x09)  # int8.js's bars of the layers kept in fp32


@pytest.fixture(scope="module")
def repaired(farm, tmp_path_factory):
    """The wide-Add model built int8 for the CPU twice: with accuracy_repair, and without. Returns the model, the
    builds and their engines."""
    tmp = tmp_path_factory.mktemp("repair-ui")
    npz = tmp / "samples.npz"
    np.savez(npz, input=np.random.default_rng(5).standard_normal((16, 3, 16, 16)).astype(np.float32))
    spec = {**sample_spec(image=16), "precision": "int8", "benchmark": QUICK}
    with Client(farm.url, token=farm.token) as c:
        model, _ = c.upload(_wide_add(tmp / "wide.onnx", seed=11), unique_name("repair-ui"))
        c.upload_samples(model["id"], npz)
        out = {"model": model}
        for key, extra in (("repaired", {"accuracy_repair": True}), ("plain", {})):
            build = c.wait_build(c.build(model["id"], [CPU], {**spec, **extra})["id"], timeout=600)
            assert [t["state"] for t in build["tasks"]] == ["succeeded"], build
            out[key] = {"build": build, "engine_id": build["tasks"][0]["engine_id"]}
        repair = out["repaired"]["build"]["quantize"]["reports"]["onnxruntime"]["repair"]
        out["repaired"]["unrepaired_id"] = repair["unrepaired"]["model_id"]
        c.wait_checks(model["id"], timeout=300)
    return out


@pytest.fixture(scope="module")
def page(farm):
    with launch_chromium() as chromium:
        context = chromium.new_context(viewport=DESKTOP)
        p = context.new_page()
        errors: list[str] = []  # script errors and CSP refusals
        p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        p.on("pageerror", lambda e: errors.append(str(e)))
        sign_in(p, farm, farm.token)
        yield p
        assert errors == [], errors


def drawn_ranking(page, key: str) -> dict:
    """The ranking chart as Chart.js holds it: labels and each dataset's values."""
    page.wait_for_selector(f"#sensitivity-{key}[data-bars]")
    return page.evaluate(
        """(key) => { const c = Chart.getChart(document.getElementById('sensitivity-chart-' + key));
        return {type: c.config.type, axis: c.options.indexAxis, labels: c.data.labels,
                sets: Object.fromEntries(c.data.datasets.map(d => [d.label, d.data]))}; }""",
        key,
    )


def painted(page, canvas_id: str, rgb: tuple[int, int, int]) -> int:
    """Pixels of this colour inside the chart's plot area."""
    return page.evaluate(
        """([id, [r, g, b]]) => { const c = document.getElementById(id);
        const a = Chart.getChart(c).chartArea, k = window.devicePixelRatio;
        const d = c.getContext('2d').getImageData(a.left * k, a.top * k, (a.right - a.left) * k,
                                                  (a.bottom - a.top) * k).data; let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i] === r && d[i + 1] === g && d[i + 2] === b) n++;
        return n; }""",
        [canvas_id, list(rgb)],
    )


def test_the_engine_page_draws_the_ranking_with_the_kept_layer_and_the_cosine_before_and_after(farm, repaired, page):
    engine_id = repaired["repaired"]["engine_id"]
    page.goto(f"{farm.url}/ui/engines/{engine_id}")
    chart = drawn_ranking(page, "engine")
    assert chart["type"] == "bar" and chart["axis"] == "y"  # horizontal bars
    kept, left = chart["sets"]["kept in fp32"], chart["sets"]["left int8"]
    # The most sensitive first, named by ONNX node: the Add whose range int8 cannot hold, kept in fp32.
    assert chart["labels"][0] == "shift", chart
    assert kept[0] is not None and kept[0] > 0.5 and left[0] is None, chart
    assert [chart["labels"][i] for i, v in enumerate(kept) if v is not None] == ["shift"], chart
    assert all(v is not None for i, v in enumerate(left) if kept[i] is None)
    assert painted(page, "sensitivity-chart-engine", KEPT_COLOUR) > 50  # the kept bar is on the canvas
    assert page.inner_text("#repair-kept-engine") == "shift"
    cosine = page.inner_text("#repair-cosine-engine")
    before, after = (float(part.split()[0]) for part in cosine.split("→"))
    assert "(fail) →" in cosine and cosine.endswith("(pass)") and before < 0.98 < after, cosine
    assert page.inner_text("#repair-outcome-engine").startswith("repaired: 1 layer(s) kept in fp32")
    latency = page.inner_text("#int8-latency-engine")
    assert "int8 stage" in latency and "not timed" in latency and "ms" in latency, latency
    # fp32, int8 without repair and int8 repaired, from the int8 stage's one run: three figures and two speed-ups.
    one_run = page.inner_text("#repair-latency-engine")
    assert one_run.count(" ms") == 3 and "× without repair" in one_run and "× repaired" in one_run, one_run
    # The failed original, kept as a variant of the build, links to its own model page.
    original = page.locator("#repair-unrepaired-engine a")
    assert "-int8-cpu-unrepaired-" in original.inner_text() and "(fail)" in page.inner_text("#repair-unrepaired-engine")
    assert original.get_attribute("href") == f"/ui/models/{repaired['repaired']['unrepaired_id']}"
    # int8 is slower than fp32 on this tiny network, repaired or not: the page says so and recommends fp32.
    speed = page.inner_text("#repair-speed-engine")
    assert speed.startswith("Not faster than fp32: the repaired int8 is not faster") and "fp32)" in speed, speed
    assert "operator" in page.inner_text("#int8-candidates-engine-1")
    # An int8 engine of the same model built without repair: its page shows nothing of it, and loads no chart.
    page.goto(f"{farm.url}/ui/engines/{repaired['plain']['engine_id']}")
    page.wait_for_selector("#benchmarks")
    assert page.locator("#int8-repair").count() == 0 and page.locator("figure[data-ranking]").count() == 0
    assert "chart.umd" not in page.content()


def test_the_report_page_shows_the_repair_of_the_build(farm, repaired, page):
    build_id = repaired["repaired"]["build"]["id"]
    page.goto(f"{farm.url}/ui/models/{repaired['model']['id']}/report")
    page.wait_for_selector("#latency-figure[data-points]")
    assert page.locator("section.int8-repair").count() == 1  # the build without repair has none
    chart = drawn_ranking(page, f"b{build_id}")
    assert chart["labels"][0] == "shift" and chart["sets"]["kept in fp32"][0] is not None, chart
    assert page.inner_text(f"#repair-kept-b{build_id}") == "shift"
    assert "(pass)" in page.inner_text(f"#repair-cosine-b{build_id}")
    assert page.inner_text(f"#repair-latency-b{build_id}").count(" ms") == 3
    assert "(fail)" in page.inner_text(f"#repair-unrepaired-b{build_id}")


def test_the_api_answers_the_int8_stage_and_documents_it(farm, repaired):
    with httpx.Client(base_url=farm.url, headers=farm.headers, timeout=60) as http:
        stage = http.get(f"/v1/engines/{repaired['repaired']['engine_id']}/int8").json()
        plain = http.get(f"/v1/engines/{repaired['plain']['engine_id']}/int8").json()
        report = http.get(f"/v1/models/{repaired['model']['id']}/report").json()
        doc = http.get("/openapi.json").json()
    repair = stage["repair"]
    assert stage["build_id"] == repaired["repaired"]["build"]["id"] and stage["family"] == "onnxruntime"
    assert repair["kept"] == ["shift"] and repair["before"]["passed"] is False and repair["after"]["passed"] is True
    top = repair["ranking"][0]
    assert top["layers"] == ["shift"] and top["kept"] is True and top["gain"] > 0.5, top
    assert [c["name"] for c in stage["candidates"] if c["kept"]], stage["candidates"]
    assert any(t["measured_by"] == "quantize" and t["fp32_median_ms"] > 0 for t in stage["latency"]), stage
    assert all(repair["latency_ms"][k] > 0 for k in ("fp32", "unrepaired", "repaired")), repair
    assert repair["unrepaired"]["model_id"] == repaired["repaired"]["unrepaired_id"]
    assert repair["unrepaired"]["accuracy"]["passed"] is False
    assert plain["repair"] is None and plain["candidates"]  # int8 without repair: its candidates, no repair
    assert {s["engine_id"]: s["repair"] is not None for s in report["int8"]} == {
        repaired["repaired"]["engine_id"]: True,
        repaired["plain"]["engine_id"]: False,
    }
    paths, schemas = doc["paths"], doc["components"]["schemas"]
    ok = paths["/v1/engines/{engine_id}/int8"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"] == "#/components/schemas/PrecisionStage"
    fields = set(schemas["Int8Repair"]["properties"])
    assert {"ranking", "kept", "before", "after", "unrepaired", "latency_ms", "speed_note"} <= fields, fields
    assert {"fp32", "unrepaired", "repaired"} == set(schemas["RepairLatency"]["properties"])
    report_schema = paths["/v1/models/{model_id}/report"]["get"]["responses"]["200"]["content"]["application/json"]
    assert report_schema["schema"]["$ref"] == "#/components/schemas/ModelReportOut"
    assert "int8" in schemas["ModelReportOut"]["properties"], json.dumps(schemas["ModelReportOut"])[:500]
