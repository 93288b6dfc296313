"""/docs and /redoc work on a farm with no internet: their scripts and styles come from the farm itself."""

from __future__ import annotations

import re

import httpx
import pytest


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_docs_load_nothing_from_elsewhere(farm, page):
    with httpx.Client(base_url=farm.url, timeout=30) as http:
        html = http.get(page)
        assert html.status_code == 200
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""", html.text)
        urls = [a or b for a, b in assets]
        assert urls and not [u for u in urls if u.startswith(("http:", "https:", "//"))], urls
        scripts = [u for u in urls if u.endswith(".js")]
        assert scripts, urls
        for url in urls:
            r = http.get(url)
            assert r.status_code == 200 and len(r.content) > (100_000 if url.endswith(".js") else 0), url


def test_the_build_spec_is_a_documented_schema(farm):
    with httpx.Client(base_url=farm.url, timeout=30) as http:
        doc = http.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert schemas["BuildRequest"]["properties"]["spec"]["$ref"] == "#/components/schemas/BuildSpec"
    assert schemas["SweepRequest"]["properties"]["spec"]["$ref"] == "#/components/schemas/BuildSpec"
    spec = schemas["BuildSpec"]
    assert spec["additionalProperties"] is False
    assert {
        "precision",
        "profiles",
        "workspace_mib",
        "optimization_level",
        "hardware_compatibility",
        "strongly_typed",
        "benchmark",
        "accuracy",
    } <= set(spec["properties"])
    assert set(schemas["Precision"]["enum"]) >= {"fp32", "fp16", "bf16", "int8", "fp8"}
    assert spec["properties"]["optimization_level"]["maximum"] == 5
