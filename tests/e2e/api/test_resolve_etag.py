"""GET and POST /v1/resolve answer with an ETag; the same question with If-None-Match gets a 304 until the model's
versions, engines or benchmarks change, and the same question from another machine is answered from the cache.

In process (TestClient) against PostgreSQL, with engine rows written as the workers write them.
"""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.http import answers as resolve_routes
from api.services import resolve as resolver
from enginefarm.core.config import Settings
from server.embedded import issue_token
from storage import checks
from storage.db import session_scope
from storage.tables import ModelRow
from tests.helpers import RTX_VERSION, catalog_engine, catalog_model, unique_name

GPU = "NVIDIA GeForce RTX 3090"
QUERY = {"cc": "8.6", "trt_rtx": RTX_VERSION, "gpu": GPU, "platform": "x86_64", "accept": "cpu"}


@pytest.fixture
def farm(own_pg, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=own_pg, reconcile_seconds=0, gc_interval_seconds=0)
    with TestClient(create_app(settings)) as http:
        http.headers["Authorization"] = f"Bearer {issue_token(settings, 'etag', ['read'])}"
        yield settings, http


def test_a_304_while_nothing_changed_and_a_new_answer_after_each_change(farm, monkeypatch):
    settings, http = farm
    name, sha = unique_name("etag"), uuid.uuid4().hex * 2
    with session_scope(settings) as s:
        model = catalog_model(s, name, sha)
        sm86, sm89, cpu = (catalog_engine(s, model, a) for a in ("sm86", "sm89", "cpu"))
    params = QUERY | {"model": name}

    first = http.get("/v1/resolve", params=params)
    assert first.status_code == 200 and first.json()["engine"]["id"] == sm86
    tag = first.headers["etag"]
    assert first.headers["cache-control"] == "private, no-cache"
    # The default answer is small: the choice, the fallbacks, counts of what was excluded and by which rule.
    assert first.json()["rejected"] is None and sum(first.json()["excluded"].values()) == 1
    assert [f["engine_id"] for f in first.json()["fallbacks"]] == [cpu]

    again = http.get("/v1/resolve", params=params, headers={"If-None-Match": tag})
    assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", tag)
    assert http.get("/v1/resolve", params=params, headers={"If-None-Match": f'"x", W/{tag}'}).status_code == 304

    # Another machine asking the same question is answered from the cache: nothing is judged again.
    def no_judging(*_a, **_k):
        raise AssertionError("judged again")

    monkeypatch.setattr(resolver, "judge", no_judging)
    cached = http.get("/v1/resolve", params=params)
    assert (cached.status_code, cached.content, cached.headers["etag"]) == (200, first.content, tag)
    # POST asks the same question in another form: the same answer and tag.
    posted = http.post(
        "/v1/resolve",
        json={
            "model": name,
            "machine": {
                "compute_capability": "8.6",
                "trt_rtx_version": RTX_VERSION,
                "gpu_name": GPU,
                "platform": "x86_64",
            },
            "accept": ["cpu"],
        },
    )
    assert posted.status_code == 200 and posted.json()["engine"]["id"] == sm86

    # A GET query string answered before is answered before its parameters are parsed: the route never runs.
    def no_route(*_a, **_k):
        raise AssertionError("the full path ran")

    monkeypatch.setattr(resolve_routes, "answer", no_route)
    fast = http.get("/v1/resolve", params=params)
    assert (fast.status_code, fast.content, fast.headers["etag"]) == (200, first.content, tag)
    assert http.get("/v1/resolve", params=params, headers={"If-None-Match": tag}).status_code == 304
    monkeypatch.undo()
    # Another question is another tag.
    other = http.get("/v1/resolve", params=params | {"cc": "8.9"})
    assert other.json()["engine"]["id"] == sm89 and other.headers["etag"] != tag

    changes = {
        "a benchmark on this GPU": lambda s: checks.record_benchmark(
            s,
            sm86,
            project="",
            shape_key="opt",
            shapes={},
            machine={},
            gpu_name=GPU,
            compute_capability="8.6",
            stats={"e2e": {"median": 3.25, "p99": 4.0}},
        ),
        "an accuracy result": lambda s: checks.record_verdict(s, sm86, "", {"pass": True}),
        "a new engine": lambda s: catalog_engine(s, s.get(ModelRow, model.id), "sm80"),
        "a new version": lambda s: catalog_model(s, name, uuid.uuid4().hex * 2, version="2", seq=2),
    }
    seen = {tag, other.headers["etag"]}
    for what, change in changes.items():
        with session_scope(settings) as s:
            change(s)
        fresh = http.get("/v1/resolve", params=params, headers={"If-None-Match": tag})
        assert fresh.status_code == 200, (what, fresh.text)
        assert fresh.headers["etag"] not in seen, what
        seen.add(tag := fresh.headers["etag"])
        if what == "a benchmark on this GPU":
            explained = http.get("/v1/resolve", params=params | {"explain": True}).json()
            assert explained["candidates"][0]["latency_ms"] == 3.25
        if what == "an accuracy result":
            assert fresh.json()["accuracy"] == "pass"
        if what == "a new engine":
            assert fresh.json()["excluded"] == {k: v + 1 for k, v in first.json()["excluded"].items()}
        if what == "a new version":  # it has no engines yet: version 1's still answer
            assert fresh.json()["engine"]["model_version"] == "1"


def test_a_token_of_another_project_never_gets_the_first_projects_answer(farm):
    settings, http = farm
    name = unique_name("etag")
    with session_scope(settings) as s:
        model = catalog_model(s, name, uuid.uuid4().hex * 2)
        catalog_engine(s, model, "sm86")
    params = QUERY | {"model": name}
    tag = http.get("/v1/resolve", params=params).headers["etag"]
    other = issue_token(settings, "elsewhere", ["read"], project=unique_name("p"))
    r = http.get("/v1/resolve", params=params, headers={"Authorization": f"Bearer {other}", "If-None-Match": tag})
    assert r.status_code == 404 and "etag" not in r.headers
