"""A build's page follows the build by a long poll on the API's build feed: an open page costs no request while
nothing moves, shows a change at once, and counts its clocks itself. Against a real API process with no worker
(a task changes only when the test writes it, as a worker's failure is written), over plain HTTP and in Chromium."""

from __future__ import annotations

import html
import re
import time

import httpx
import pytest

from tests.browser import launch_chromium
from tests.e2e.ui.test_session import signed_in
from tests.queuedbuilds import UNSERVED, fail_later, queue_only_farm, queued_build

TAG = re.compile(r'data-tag="([^"]+)"')


def tag_in(fragment: str) -> str:
    return html.unescape(TAG.search(fragment)[1])


@pytest.fixture(scope="module")
def quiet_farm(base_services, tmp_path_factory):
    with queue_only_farm(tmp_path_factory.mktemp("live-page-farm"), "live-page", seed=5151) as farm:
        yield farm


@pytest.fixture
def browserless(quiet_farm):
    with httpx.Client(base_url=quiet_farm.url, timeout=60, follow_redirects=False) as client:
        signed_in(client, quiet_farm.token)
        yield client


def test_the_tasks_fragment_answers_when_the_build_changes(quiet_farm, browserless):
    build_id, task_id = queued_build(quiet_farm)
    first = browserless.get(f"/ui/builds/{build_id}/tasks")
    assert first.status_code == 200 and 'data-live="true"' in first.text, first.text[:500]
    tag = tag_in(first.text)
    fail_later(quiet_farm, task_id, 1.0)
    t0 = time.monotonic()
    changed = browserless.get(f"/ui/builds/{build_id}/tasks", params={"wait": 20, "seen": tag})
    took = time.monotonic() - t0
    assert changed.status_code == 200
    assert 'data-state="failed"' in changed.text and 'data-live="false"' in changed.text, changed.text[:800]
    assert "stopped by the test" in changed.text
    assert tag_in(changed.text) != tag
    assert 0.9 <= took < 5, took  # held until the write, answered soon after it


def test_nothing_changing_holds_the_fragment_for_the_wait(quiet_farm, browserless):
    build_id, _ = queued_build(quiet_farm)
    tag = tag_in(browserless.get(f"/ui/builds/{build_id}/tasks").text)
    t0 = time.monotonic()
    same = browserless.get(f"/ui/builds/{build_id}/tasks", params={"wait": 2, "seen": tag})
    assert 1.9 <= time.monotonic() - t0 < 10
    assert same.status_code == 200 and tag_in(same.text) == tag
    for wait in ("-1", "31", "nan"):
        refused = browserless.get(f"/ui/builds/{build_id}/tasks", params={"wait": wait, "seen": tag})
        assert refused.status_code == 422, (wait, refused.status_code, refused.text[:300])


def test_the_model_matrix_answers_when_a_build_of_the_model_changes(quiet_farm, browserless):
    _, task_id = queued_build(quiet_farm)
    path = f"/ui/models/{quiet_farm.model_id}/matrix"
    first = browserless.get(path)
    assert 'data-live="true"' in first.text and 'data-state="queued"' in first.text, first.text[:600]
    tag = tag_in(first.text)
    t0 = time.monotonic()
    assert tag_in(browserless.get(path, params={"wait": 1.5, "seen": tag}).text) == tag  # nothing moved: held
    assert time.monotonic() - t0 >= 1.4
    fail_later(quiet_farm, task_id, 1.0)
    t0 = time.monotonic()
    changed = browserless.get(path, params={"wait": 20, "seen": tag})
    took = time.monotonic() - t0
    assert 'data-state="failed"' in changed.text and 'data-live="false"' in changed.text, changed.text[:600]
    assert tag_in(changed.text) != tag
    assert 0.9 <= took < 5, took


def test_an_open_build_page_asks_only_when_something_changes(quiet_farm):
    build_id, task_id = queued_build(quiet_farm)
    with launch_chromium() as chromium:
        context = chromium.new_context()
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{quiet_farm.url}/ui/signin?next=/ui/builds/{build_id}")
        page.fill("#token", quiet_farm.token)
        page.keyboard.press("Enter")
        page.wait_for_url(f"{quiet_farm.url}/ui/builds/{build_id}")
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if f"/ui/builds/{build_id}/tasks" in r.url else None)
        clock = page.locator(f"tr.task[data-target='{UNSERVED}'] [data-elapsed]")
        before = int(clock.inner_text())
        page.wait_for_timeout(4000)
        # The clock ticks in the page, and the page has one question in flight, not one a second.
        assert int(clock.inner_text()) >= before + 3
        assert len(asked) <= 1, asked
        fail_later(quiet_farm, task_id, 0.0)
        page.wait_for_selector("#tasks[data-live='false']", timeout=5000)
        row = page.locator(f"tr.task[data-target='{UNSERVED}']")
        assert row.get_attribute("data-state") == "failed"
        assert "stopped by the test" in row.inner_text()
        settled = len(asked)
        page.wait_for_timeout(2000)
        assert len(asked) == settled  # a finished build is not asked about again
        assert errors == []
        context.close()
