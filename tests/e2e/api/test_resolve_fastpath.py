"""GET /v1/resolve from a cached token is answered before routing (``api/http/fastpath.py``): the same question gets the
same status, body and ETag there as through the route, and whatever that path cannot answer exactly as the route
would (an unknown parameter, a value that does not validate, build=true) is left to the route, which words the 422.

In process (TestClient) against PostgreSQL, with engine rows written as the workers write them.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.http import fastpath
from enginefarm.core.config import Settings
from server.embedded import issue_token
from storage.db import session_scope
from tests.helpers import RTX_VERSION, catalog_engine, catalog_model, unique_name

GPU = "NVIDIA GeForce RTX 3090"
MACHINE = {"cc": "8.6", "trt_rtx": RTX_VERSION, "gpu": GPU, "platform": "x86_64"}


@pytest.fixture(scope="module")
def catalog(own_pg, tmp_path_factory):
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("fastpath"), database_url=own_pg, reconcile_seconds=0, gc_interval_seconds=0
    )
    token = issue_token(settings, "fastpath", ["read"])
    name = unique_name("fast")
    with session_scope(settings) as s:
        model = catalog_model(s, name, uuid.uuid4().hex * 2)
        for arch in ("sm80", "sm86", "sm89", "cpu"):
            catalog_engine(s, model, arch)
    return settings, token, name


def _client(settings, token) -> TestClient:
    http = TestClient(create_app(settings))
    http.headers["Authorization"] = f"Bearer {token}"
    return http


def _questions(name: str) -> list[list[tuple[str, str]]]:
    """Query strings as pairs (repeated names kept): each spelling a fleet or a person sends."""
    base = [("model", name), *MACHINE.items()]
    return [
        base,
        [*base, ("accept", "cpu")],
        [*base, ("accept", "cpu"), ("explain", "true")],
        [*base, ("precisions", "fp16,fp32"), ("precisions", "int8"), ("accept", "cpu")],
        [*base, ("shapes", "images:1x3x640x640")],
        [*base, ("version", "latest"), ("precision", "fp16")],
        [("model", name), ("cc", "7.5"), ("trt_rtx", RTX_VERSION)],  # nothing fits: a 404 with the reasons
        [("model", name), ("platform", "x86_64")],  # the CPU artifact
        [("model", "no-such-model"), *MACHINE.items()],  # a 404 for the model
        [*base, ("cc", "8.9"), ("gpu", "NVIDIA L4")],  # a name given twice: the last value, as the route reads it
    ]


def _ask(http: TestClient, pairs) -> tuple[int, bytes, str | None, str | None]:
    r = http.get("/v1/resolve", params=pairs)
    return r.status_code, r.content, r.headers.get("etag"), r.headers.get("cache-control")


def test_a_question_gets_the_same_answer_and_tag_before_routing_as_through_the_route(catalog, monkeypatch):
    settings, token, name = catalog
    questions = _questions(name)
    # Through the route: a fresh API process with the fast path turned away.
    with monkeypatch.context() as m, _client(settings, token) as http:
        m.setattr(fastpath, "parsed", lambda _q: None)
        routed = [_ask(http, q) for q in questions]
    # Before routing: another fresh process (nothing kept), its token cached by one request first.
    taken = []
    real = fastpath.answered
    monkeypatch.setattr(fastpath, "answered", lambda *a: taken.append(a[0].model) or real(*a))
    with _client(settings, token) as http:
        assert http.get("/v1/resolve", params={"model": name}).status_code in (200, 404)  # caches the token
        assert not taken, "the first request of a token goes through the route"
        direct = [_ask(http, q) for q in questions]
    assert len(taken) == len(questions), "every question was answered before routing"
    assert [s for s, *_ in routed] == [200, 200, 200, 200, 200, 200, 404, 200, 404, 200]
    for q, a, b in zip(questions, routed, direct):
        assert a == b, q
    assert routed[6][3] == "no-store" and b"tensorrt-rtx/sm86" in routed[6][1]  # the 404 says why, per engine


def _after_the_token_is_cached(catalog, monkeypatch, params) -> tuple[httpx.Response, list]:
    """GET /v1/resolve with ``params`` from a token the process has cached, and the questions the fast path took."""
    settings, token, name = catalog
    taken: list = []
    real = fastpath.answered
    monkeypatch.setattr(fastpath, "answered", lambda *a: taken.append(a) or real(*a))
    with _client(settings, token) as http:
        http.get("/v1/resolve", params={"model": name, **MACHINE})  # caches the token
        taken.clear()
        return http.get("/v1/resolve", params=params), taken


@pytest.mark.parametrize(
    "extra, words",
    [
        ([("bogus", "1")], "unknown query parameter 'bogus'"),
        ([("trt_version", "10.3")], "did you mean trt?"),
        ([("cc", "86")], "cc"),
        ([("shapes", "images:1xx3")], "write shapes as trtexec does"),
        ([("accept", "maybe")], "accept"),
    ],
)
def test_what_the_route_refuses_is_left_to_the_route(catalog, monkeypatch, extra, words):
    r, taken = _after_the_token_is_cached(catalog, monkeypatch, [("model", catalog[2]), *MACHINE.items(), *extra])
    assert r.status_code == 422, r.text
    assert words in r.text
    assert not taken


def test_build_true_is_left_to_the_route_which_checks_the_scope(catalog, monkeypatch):
    query = {"model": catalog[2], "cc": "7.5", "trt_rtx": RTX_VERSION, "build": "true"}
    r, taken = _after_the_token_is_cached(catalog, monkeypatch, query)
    assert r.status_code == 403, r.text
    assert "resolve with build=true needs 'build'" in r.text
    assert not taken


@pytest.mark.parametrize("threads", [1, 3])
def test_answers_are_computed_on_at_most_the_resolve_threads(catalog, monkeypatch, threads):
    """ENGINEFARM_RESOLVE_THREADS bounds the answers computed at once in a process (the server's pool has 40
    threads): through the route (POST) and before it (GET) alike."""
    settings, token, name = catalog
    from api.http import answers as resolve_routes

    busy, most, lock = [0], [0], threading.Lock()
    real = resolve_routes.answer

    def counted(*a):
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        try:
            time.sleep(0.05)
            return real(*a)
        finally:
            with lock:
                busy[0] -= 1

    monkeypatch.setattr(resolve_routes, "answer", counted)
    settings = settings.model_copy(update={"resolve_threads": threads})
    with _client(settings, token) as http:
        http.get("/v1/resolve", params={"model": name, **MACHINE})  # caches the token
        most[0] = 0

        def ask(i: int) -> int:
            if i % 2:
                body = {"model": name, "machine": {"compute_capability": "8.6", "trt_rtx_version": RTX_VERSION}}
                return http.post("/v1/resolve", json=body).status_code
            return http.get("/v1/resolve", params={"model": name, **MACHINE, "memory_mib": str(1000 + i)}).status_code

        with ThreadPoolExecutor(12) as pool:
            assert set(pool.map(ask, range(12))) == {200}
    assert most[0] == threads


def test_the_dashboards_question_is_never_taken_for_the_apis(catalog):
    """The dashboard's resolve page answers through the route's function with ``explain`` and its own reading of its
    query string; a fleet's GET of the same query string must get the API's answer, not the page's kept one."""
    from api.ui.session import COOKIE

    settings, token, name = catalog
    query = {"model": name, "platform": "x86_64"}
    with _client(settings, token) as http:
        page = http.get("/ui/resolve", params=query, headers={"Cookie": f"{COOKIE}={token}"})
        assert page.status_code == 200, page.text
        api = http.get("/v1/resolve", params=query)
    assert api.status_code == 200, api.text
    assert api.json()["candidates"] is None and api.json()["rejected"] is None  # not the page's explained answer


def test_a_fleets_question_stays_on_the_fast_path_among_many_asked_once(catalog, monkeypatch):
    """The query strings answered before are kept least recently used out, and one the full path answers from a
    kept body (or with a 304) is taken back: with room for 8, a fleet's question asked between each of 20 others,
    each asked once, is answered before routing every time after its first. It used to fall out after 8 others
    (first in, first out) and then went through the full path for good, its body still kept."""
    settings, token, name = catalog
    settings = settings.model_copy(update={"resolve_cache_entries": 8})
    fleet = [("model", name), *MACHINE.items()]
    computed: list[bytes] = []
    real = fastpath.direct_answer

    async def counted(app, scope, principal):
        computed.append(scope["query_string"])
        return await real(app, scope, principal)

    monkeypatch.setattr(fastpath, "direct_answer", counted)
    with _client(settings, token) as http:
        first = http.get("/v1/resolve", params=fleet)
        assert first.status_code == 200, first.text
        tag = first.headers["etag"]
        del computed[:]
        for i in range(20):
            other = http.get("/v1/resolve", params=[*fleet, ("memory_mib", str(4000 + i))])
            assert other.status_code == 200, other.text
            again = http.get("/v1/resolve", params=fleet, headers={"If-None-Match": tag} if i % 2 else {})
            assert again.status_code == (304 if i % 2 else 200) and again.headers["etag"] == tag
    assert len(computed) == 20, computed  # the 20 others, each once; the fleet's question never


def test_a_build_question_is_never_remembered_for_the_fast_path(catalog):
    """build=true may write (a build where nothing fits), so the route checks the token's scope every time: a build
    token's build=true question answered with an engine (200) is not remembered, and a read token of the same
    project asking the same query string is told 403 by the route, not handed the kept answer before routing."""
    settings, reader, name = catalog
    builder = issue_token(settings, "fastpath-build", ["build"])
    query = {"model": name, **MACHINE, "build": "true"}
    with _client(settings, builder) as http:
        for _ in range(2):
            r = http.get("/v1/resolve", params=query)
            assert r.status_code == 200, r.text
        as_reader = {"Authorization": f"Bearer {reader}"}
        assert http.get("/v1/resolve", params={"model": name, **MACHINE}, headers=as_reader).status_code == 200
        r = http.get("/v1/resolve", params=query, headers=as_reader)
        assert r.status_code == 403, r.text
        assert "resolve with build=true needs 'build'" in r.text
