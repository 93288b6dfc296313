"""Waiting for a build (``GET /v1/builds/{id}?wait=`` with If-None-Match, a long poll), on PostgreSQL (a trigger's
NOTIFY) and SQLite (``data_version``), against a real API process with no worker: a task changes only when the
test writes it, with the same bulk UPDATE a worker's failure writes."""

from __future__ import annotations

import time
from contextlib import nullcontext

import httpx
import pytest

from enginefarm.client import Client
from server import localservers
from storage import catalog
from storage.db import in_transaction
from tests.conftest import PG_DB
from tests.queuedbuilds import fail_later, queue_only_farm, queued_build


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def waiting_farm(request, base_services, tmp_path_factory):
    data = tmp_path_factory.mktemp(f"wait-farm-{request.param}")
    pg = localservers.scratch_postgres(f"{PG_DB}_wait") if request.param == "postgresql" else nullcontext()
    with pg as url, queue_only_farm(data, "waiting", seed=4242, database_url=url) as farm:
        yield farm


def test_a_waiting_client_gets_the_build_as_soon_as_a_task_changes(waiting_farm):
    build_id, task_id = queued_build(waiting_farm)
    with httpx.Client(base_url=waiting_farm.url, headers=waiting_farm.headers, timeout=60) as c:
        first = c.get(f"/v1/builds/{build_id}")
        assert first.status_code == 200 and first.headers["etag"], first.text
        done = fail_later(waiting_farm, task_id, 1.0)
        t0 = time.monotonic()
        r = c.get(f"/v1/builds/{build_id}", params={"wait": 20}, headers={"If-None-Match": first.headers["etag"]})
        answered = time.monotonic()
    assert r.status_code == 200, r.text
    assert r.json()["tasks"][0]["state"] == "failed"
    assert r.headers["etag"] != first.headers["etag"]
    assert answered - t0 >= 0.9, "answered before anything changed"
    assert answered - done["at"] < 0.5, f"answered {answered - done['at']:.2f} s after the change"


def test_nothing_changing_answers_304_after_the_wait_with_the_same_tag(waiting_farm):
    build_id, task_id = queued_build(waiting_farm)
    with httpx.Client(base_url=waiting_farm.url, headers=waiting_farm.headers, timeout=60) as c:
        tag = c.get(f"/v1/builds/{build_id}").headers["etag"]
        t0 = time.monotonic()
        r = c.get(f"/v1/builds/{build_id}", params={"wait": 1.5}, headers={"If-None-Match": tag})
        took = time.monotonic() - t0
        # without a tag, or with one that is not current, the answer comes at once, whatever the wait
        t1 = time.monotonic()
        untagged = c.get(f"/v1/builds/{build_id}", params={"wait": 20})
        stale = c.get(f"/v1/builds/{build_id}", params={"wait": 20}, headers={"If-None-Match": '"not-it"'})
        at_once = time.monotonic() - t1
    in_transaction(catalog.fail_task, task_id, "cleaned up", settings=waiting_farm.settings)
    assert r.status_code == 304 and r.content == b"" and r.headers["etag"] == tag
    assert 1.5 <= took < 5, took
    assert untagged.status_code == stale.status_code == 200
    assert untagged.headers["etag"] == stale.headers["etag"] == tag
    assert at_once < 1.0, at_once


@pytest.mark.parametrize("wait", ["-1", "31", "soon", "nan", "inf"])
def test_a_wait_out_of_range_is_a_422_that_names_it(waiting_farm, wait):
    with httpx.Client(base_url=waiting_farm.url, headers=waiting_farm.headers, timeout=60) as c:
        r = c.get("/v1/builds/1", params={"wait": wait}, headers={"If-None-Match": '"x"'})
    assert r.status_code == 422, r.text
    assert "wait" in r.text


def test_the_client_sees_a_finished_build_at_once_with_few_requests(waiting_farm):
    build_id, task_id = queued_build(waiting_farm)
    asked: list[str] = []
    with Client(waiting_farm.url, token=waiting_farm.token) as c:
        c.http.event_hooks["request"].append(lambda request: asked.append(str(request.url)))
        done = fail_later(waiting_farm, task_id, 2.0)
        build = c.wait_build(build_id, timeout=30)
        answered = time.monotonic()
    assert build["tasks"][0]["state"] == "failed"
    assert answered - done["at"] < 0.5, f"saw it {answered - done['at']:.2f} s after the change"
    # one read, then one request that waited for the change (a poller every 0.5 s asks five times)
    assert len(asked) <= 3, asked
