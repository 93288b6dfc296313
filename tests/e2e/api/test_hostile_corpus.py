"""The hostile-input corpus (tests/corpus) against the real farm: every entry gets its exact status and
message, never a 5xx; afterwards nothing rejected was catalogued or stored, and both workers still live.

The entries run in corpus order; ``test_corpus_left_nothing_behind`` runs after them (file order).
"""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from enginefarm.graph.samples import conv_net
from storage import catalog
from storage.db import session_scope
from storage.tokens import create_token, revoke_token
from tests.corpus import CORPUS, Context, Entry, by_category
from tests.faults import bucket_keys
from tests.helpers import unique_name


def _model_rows(settings) -> tuple[int, set[str]]:
    """(model rows, the blob keys they reference: model bytes and samples)."""
    with session_scope(settings) as s:
        rows, total = catalog.list_models(s, limit=100_000)
        return total, {r.blob_key for r in rows} | {r.samples_key for r in rows if r.samples_key}


def _scratch(settings) -> set[str]:
    """Spooled uploads and scratch folders under the work dir: a rejection must leave none of its own."""
    work = settings.work_dir
    return {
        str(p.relative_to(work))
        for pattern in ("uploads/upload-*", "build-*", "build-*/bundle-*")
        for p in work.glob(pattern)
    }


@pytest.fixture(scope="module")
def corpus_ctx(farm, dist_settings, tmp_path_factory):
    """A valid model for specs and samples to aim at, and the state the corpus must leave unchanged."""
    with httpx.Client(base_url=farm.url, timeout=60, headers=farm.headers) as c:
        r = c.post(
            "/v1/models",
            data={"name": unique_name("corpus")},
            files={"file": ("m.onnx", conv_net(seed=4245).SerializeToString())},
        )
        assert r.status_code == 201, r.text
    ctx = Context(model_id=r.json()["id"], model_name=r.json()["name"], tmp=tmp_path_factory.mktemp("corpus"))
    with session_scope(dist_settings) as s:
        ctx.tokens = {scope: create_token(s, f"corpus-{scope}", [scope])[1] for scope in ("read", "build")}
        revoked, ctx.tokens["revoked"] = create_token(s, "corpus-revoked", ["admin"])
        revoke_token(s, revoked.id)
        ctx.tokens["expired"] = create_token(s, "corpus-expired", ["admin"], timedelta(microseconds=1))[1]
    ctx.before = {
        "models": _model_rows(dist_settings)[0],
        "keys": bucket_keys(dist_settings),
        "scratch": _scratch(dist_settings),
    }
    return ctx


def _said(response: httpx.Response) -> str:
    """What the answer says: the error's detail and problems, or validation messages; the raw body for 2xx."""
    if response.is_success or not response.headers.get("content-type", "").startswith("application/json"):
        return response.text  # a dashboard page says it in its HTML
    body = response.json()
    detail = body.get("detail")
    parts = [detail] if isinstance(detail, str) else [f"{e.get('loc')}: {e.get('msg')}" for e in detail or []]
    parts += [p.get("msg") or p.get("reason") or "" for p in body.get("problems", [])]
    return " | ".join(parts)


def _entry_params() -> list:
    return [
        pytest.param(
            e,
            id=f"{e.category}:{e.id}",
            marks=[pytest.mark.xfail(reason=e.known_failure, strict=True)] if e.known_failure else [],
        )
        for e in CORPUS
    ]


def test_corpus_is_large_and_well_formed():
    ids = [(e.category, e.id) for e in CORPUS]
    assert len(ids) == len(set(ids)), "corpus ids repeat"
    rejections = [e for e in CORPUS if 400 <= e.status < 500 and not e.known_failure]
    assert len(CORPUS) >= 40 and len(rejections) >= 40, by_category()
    assert all(400 <= e.status < 500 or (e.status == 200 and e.category == "query") for e in CORPUS)
    assert all(e.message for e in CORPUS)


@pytest.mark.parametrize("entry", _entry_params())
def test_hostile_input(api, corpus_ctx, entry: Entry):
    req = entry.request(corpus_ctx)
    if req.anonymous:
        response = httpx.request(req.method, f"{api.base_url}{req.url}", timeout=60, **req.kwargs)
    else:
        response = api.request(req.method, req.url, **req.kwargs)
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    assert response.status_code == entry.status, response.text[:1000]
    said = _said(response)
    assert entry.message.lower() in said.lower(), said[:1000]
    if response.status_code == 401:  # tells the client how to authenticate, and never echoes what it sent
        assert response.headers["www-authenticate"].startswith("Bearer")
        sent = req.kwargs.get("headers", {}).get("Authorization", "").partition(" ")[2]
        assert len(sent) < 8 or sent not in response.text


def test_corpus_left_nothing_behind(api, corpus_ctx, dist_settings):
    before = corpus_ctx.before
    total, referenced = _model_rows(dist_settings)
    assert total == before["models"], "a rejected upload was catalogued"
    with session_scope(dist_settings) as s:
        # Empty names filter nothing; PostgreSQL text cannot hold NUL, so no row can have one.
        for name in {n for n in corpus_ctx.names if n.strip() and "\x00" not in n}:
            assert catalog.list_models(s, name=name, limit=1)[1] == 0, f"model {name[:60]!r} was catalogued"

    keys = bucket_keys(dist_settings)
    assert keys - before["keys"] == set(), "rejected bytes were stored"
    assert {k for k in keys if k.startswith("models/")} <= referenced, "a model blob no row references"
    assert _scratch(dist_settings) - before["scratch"] == set(), "a rejected upload left files in the work dir"
    assert not corpus_ctx.pickle_marker.exists(), "the server unpickled an uploaded samples file"

    live = {w["id"].split("@")[0] for w in api.get("/v1/workers").json()}
    assert {"worker-a", "worker-b"} <= live, live
    assert api.get("/healthz").json()["status"] == "ok"
