"""The resolver page ("Which engine?") over plain HTTP against the session farm: its URL's query fills the form and
shows the answer, in the form's field names or GET /v1/resolve's, and agrees with /v1/resolve."""

from __future__ import annotations

import html
import re

import httpx
import pytest

from enginefarm.client import Client
from enginefarm.graph.samples import conv_net, sample_spec
from tests.e2e.ui.test_session import signed_in
from tests.helpers import unique_name

CPU = "onnxruntime/cpu-x86_64"
NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}


@pytest.fixture(scope="module")
def cpu_model(farm) -> str:
    """A model with one CPU artifact; returns its name."""
    name = unique_name("ui-resolve")
    with Client(farm.url, token=farm.token) as c:
        r = httpx.post(
            f"{farm.url}/v1/models",
            headers=farm.headers,
            timeout=60,
            data={"name": name},
            files={"file": ("m.onnx", conv_net(seed=7171).SerializeToString())},
        )
        assert r.status_code == 201, r.text
        build = c.wait_build(
            c.build(r.json()["id"], [CPU], {**sample_spec(), **NO_CHECKS})["id"], timeout=300, poll=0.3
        )
        assert build["tasks"][0]["state"] == "succeeded", build
    return name


@pytest.fixture
def browser(farm):
    with httpx.Client(base_url=farm.url, timeout=60, follow_redirects=False) as client:
        signed_in(client, farm.token)
        yield client


def _value(page: str, field_id: str) -> str:
    tag = re.search(rf'<input id="{field_id}"[^>]*>', page).group(0)
    return html.unescape(re.search(r'value="([^"]*)"', tag).group(1))


def test_the_query_fills_the_form_and_shows_the_answer(farm, api, browser, cpu_model):
    page = browser.get(
        "/ui/resolve",
        params={
            "model": cpu_model,
            "platform": "x86_64",
            "gpu_name": "NVIDIA GeForce RTX 3090",
            "shapes": "input:2x3x32x32",
        },
    )
    assert page.status_code == 200, page.text
    assert _value(page.text, "r-model") == cpu_model and _value(page.text, "r-gpu") == "NVIDIA GeForce RTX 3090"
    assert _value(page.text, "r-shapes") == "input:2x3x32x32"
    assert '<option value="x86_64" selected>' in page.text
    engine = re.search(r'id="answer-engine">engine (\d+), ([^<]+)</a>', page.text)
    assert engine and engine.group(2) == CPU, page.text[-3000:]
    same = api.get(
        "/v1/resolve",
        params={
            "model": cpu_model,
            "platform": "x86_64",
            "gpu": "NVIDIA GeForce RTX 3090",
            "shapes": "input:2x3x32x32",
        },
    )
    assert same.status_code == 200 and same.json()["engine"]["id"] == int(engine.group(1)), same.text
    assert 'id="explain-table"' in page.text


def test_the_query_takes_get_v1_resolves_names(browser, cpu_model):
    query = {
        "model": cpu_model,
        "cc": "8.6",
        "gpu": "NVIDIA GeForce RTX 3090",
        "trt_rtx": "1.7.1.116",
        "driver": "580.65",
    }
    page = browser.get("/ui/resolve", params=query)
    assert page.status_code == 200, page.text
    assert [_value(page.text, f) for f in ("r-cc", "r-gpu", "r-rtx", "r-driver")] == [
        "8.6",
        "NVIDIA GeForce RTX 3090",
        "1.7.1.116",
        "580.65",
    ]
    # A machine that names TensorRT-RTX is not handed the ONNX Runtime file unasked; the page says which rule.
    assert 'id="answer-engine"' not in page.text and "named-runtime" in page.text
    asked = browser.get("/ui/resolve", params=query | {"accept": "cpu"})
    assert 'id="answer-engine"' in asked.text and 'name="accept" value="cpu" checked' in asked.text


def test_a_query_the_resolver_cannot_answer_says_why(browser, cpu_model):
    unknown = browser.get("/ui/resolve", params={"model": unique_name("nothing")})
    assert unknown.status_code == 404 and "no model" in unknown.text.lower()
    bad = browser.get("/ui/resolve", params={"model": cpu_model, "cc": "eight"})
    assert bad.status_code == 422 and "compute_capability" in bad.text
    empty = browser.get("/ui/resolve")
    assert empty.status_code == 200 and 'id="resolve-result"' not in empty.text
