"""The fp16 accuracy repair in the dashboard, in a real browser against the session farm: a model whose square
leaves fp16's range, built fp16 for the CPU with ``accuracy_repair`` and without. The repaired engine's page and the
model's report draw the ranking labelled fp16 (the share of output elements brought within the tolerance, the kept
node in its own colour) with the share outside the tolerance before and after; the engine built without repair shows
nothing of it; OpenAPI documents GET /v1/engines/{id}/fp16 and the report's ``fp16``."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from enginefarm.client import Client
from tests.e2e.ui.test_repair_page import KEPT_COLOUR, drawn_ranking, page, painted  # noqa: F401 - page is a fixture
from tests.helpers import unique_name
from tests.unit.worker.test_fp16_repair import SHAPES, overflow_model, overflow_samples

CPU = "onnxruntime/cpu-x86_64"
QUICK = {"warmup_ms": 20, "duration_s": 0.3, "iterations": 10}


@pytest.fixture(scope="module")
def fp16_builds(farm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fp16-repair-ui")
    npz = tmp / "samples.npz"
    np.savez(npz, input=overflow_samples(16))
    spec = {"precision": "fp16", "shapes": SHAPES, "benchmark": QUICK}
    with Client(farm.url, token=farm.token) as c:
        model, _ = c.upload(overflow_model(tmp / "overflow.onnx", tag="-ui"), unique_name("fp16-repair-ui"))
        c.upload_samples(model["id"], npz)
        out = {"model": model}
        for key, extra in (("repaired", {"accuracy_repair": True}), ("plain", {})):
            build = c.wait_build(c.build(model["id"], [CPU], {**spec, **extra})["id"], timeout=600)
            assert [t["state"] for t in build["tasks"]] == ["succeeded"], build
            out[key] = {"build": build, "engine_id": build["tasks"][0]["engine_id"]}
        c.wait_checks(model["id"], timeout=300)
    return out


def test_the_engine_page_draws_the_fp16_ranking_with_the_kept_node(farm, fp16_builds, page):  # noqa: F811
    page.goto(f"{farm.url}/ui/engines/{fp16_builds['repaired']['engine_id']}")
    assert page.inner_text("#fp16-repair h2") == "fp16 accuracy repair"
    chart = drawn_ranking(page, "engine")
    kept, left = chart["sets"]["kept in fp32"], chart["sets"]["left fp16"]
    assert chart["labels"][0] == "square" and kept[0] == 1.0 and left[0] is None, chart
    assert [chart["labels"][i] for i, v in enumerate(kept) if v is not None] == ["square"], chart
    assert painted(page, "sensitivity-chart-engine", KEPT_COLOUR) > 50
    assert page.inner_text("#repair-kept-engine") == "square"
    assert page.inner_text("#repair-outcome-engine").startswith("repaired: 1 node(s) kept in fp32 pass the fp16 gate")
    share = page.inner_text("#repair-violations-engine")
    assert share.startswith("100.00% (inf or NaN) of output elements (fail) → 0.00% (pass)"), share
    assert "ONNX Runtime on the CPU" in page.inner_text("#repair-measured-engine")
    assert "Mul" in page.inner_text("#ranking-engine")
    assert page.locator("#int8-latency-engine").count() == 0  # fp16 has no stage that times
    page.goto(f"{farm.url}/ui/engines/{fp16_builds['plain']['engine_id']}")
    page.wait_for_selector("#benchmarks")
    assert page.locator("#fp16-repair").count() == 0 and page.locator("figure[data-ranking]").count() == 0


def test_the_report_page_shows_the_fp16_repair_of_the_build(farm, fp16_builds, page):  # noqa: F811
    build_id = fp16_builds["repaired"]["build"]["id"]
    page.goto(f"{farm.url}/ui/models/{fp16_builds['model']['id']}/report")
    page.wait_for_selector("#latency-figure[data-points]")
    assert page.locator("section.fp16-repair").count() == 1 and page.locator("section.int8-repair").count() == 0
    assert page.inner_text(f"#repair-h-{build_id}").startswith("fp16 accuracy repair")
    chart = drawn_ranking(page, f"b{build_id}")
    assert chart["labels"][0] == "square" and chart["sets"]["kept in fp32"][0] == 1.0, chart


def test_openapi_documents_the_fp16_repair(farm):
    with httpx.Client(base_url=farm.url, headers=farm.headers, timeout=60) as http:
        doc = http.get("/openapi.json").json()
    paths, schemas = doc["paths"], doc["components"]["schemas"]
    ok = paths["/v1/engines/{engine_id}/fp16"]["get"]["responses"]
    assert ok["200"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/PrecisionStage"
    assert "404" in ok
    assert {"precision", "measured_on", "judged_on", "candidate_layers"} <= set(schemas["Int8Repair"]["properties"])
    assert {"violations_alone_float", "violations_fp16", "ops"} <= set(schemas["RankedTensor"]["properties"])
    assert "fp16" in schemas["ModelReportOut"]["properties"] and "precision" in schemas["PrecisionStage"]["properties"]
