"""The computed path of /v1/resolve keeps each model's kinds of engine and its engines compiled
(``api.services.resolve.Tables``) and the fleet's path keeps the versions' generations (``api.services.versions``):
neither may ever answer from a state the catalog left.

The same changes as tests/e2e/api/test_resolve_etag.py (a benchmark, an accuracy verdict, a new engine, a new version),
made here by another process, and another project's verdict, which must not move this project's answer. In process
(TestClient) against PostgreSQL and, for the embedded farm's feed, SQLite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.http import answers as answers_module
from api.services.versions import Versions
from enginefarm.core.config import Settings
from server.embedded import issue_token
from storage import resolution
from storage.changes import changes_for
from storage.db import session_scope
from tests.helpers import RTX_VERSION, catalog_engine, catalog_model, unique_name

GPU = "NVIDIA GeForce RTX 3090"
QUERY = {"cc": "8.6", "trt_rtx": RTX_VERSION, "gpu": GPU, "platform": "x86_64", "accept": "cpu"}
ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]


@pytest.fixture
def farm(own_pg, tmp_path):
    # A stated time long enough that only the change feed can explain a fresh answer within this test.
    settings = Settings(
        data_dir=tmp_path, database_url=own_pg, reconcile_seconds=0, gc_interval_seconds=0, resolve_fresh_seconds=5
    )
    with TestClient(create_app(settings)) as http:
        http.headers["Authorization"] = f"Bearer {issue_token(settings, 'tables', ['read'])}"
        assert http.app.state.versions.changes.wait_listening()
        yield settings, http


def elsewhere(settings: Settings, code: str) -> None:
    """Run ``code`` (with ``s``, a session of the catalog) in another process, committed when it returns."""
    script = textwrap.dedent(f"""
        import uuid
        from enginefarm.core.config import Settings
        from storage import checks
        from storage.db import session_scope
        from storage.tables import ModelRow
        from tests.helpers import catalog_engine, catalog_model
        with session_scope(Settings(data_dir={str(settings.data_dir)!r}, database_url={settings.database_url!r})) as s:
    """) + textwrap.indent(textwrap.dedent(code), "    ")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=120)


def fresh(http, params: dict, old_tag: str, *, deadline_s: float = 4.0):
    """The answer once its tag moved: the change feed's notification takes milliseconds to arrive; the 5 s stated
    time would take longer than ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while True:
        r = http.get("/v1/resolve", params=params, headers={"If-None-Match": old_tag})
        if r.status_code != 304 or time.monotonic() > end:
            return r
        time.sleep(0.02)


def test_a_change_by_another_process_reaches_the_fleets_path_and_rebuilds_the_table(farm, monkeypatch):
    settings, http = farm
    name, sha = unique_name("tables"), uuid.uuid4().hex * 2
    with session_scope(settings) as s:
        model = catalog_model(s, name, sha)
        model_id = model.id
        sm86, _sm89, cpu = (catalog_engine(s, model, a) for a in ("sm86", "sm89", "cpu"))
    params = QUERY | {"model": name}
    reads = []  # the model's kinds of engine, read (``resolution.kind_table``) where no table of them is kept
    real_table = resolution.kind_table
    monkeypatch.setattr(resolution, "kind_table", lambda *a: reads.append(1) or real_table(*a))

    first = http.get("/v1/resolve", params=params)
    assert first.status_code == 200 and first.json()["engine"]["id"] == sm86 and len(reads) == 1
    tag = first.headers["etag"]
    # Another machine, the same model: judged again, from the same kinds (no second read of them).
    other = http.get("/v1/resolve", params=params | {"cc": "8.9", "gpu": "NVIDIA L4"})
    assert other.status_code == 200 and other.headers["etag"] != tag and len(reads) == 1
    # The fleet's path answers the known question from the kept versions: no query at all.
    monkeypatch.setattr(answers_module, "_versions", lambda *a: pytest.fail("read the versions again"))
    assert http.get("/v1/resolve", params=params, headers={"If-None-Match": tag}).status_code == 304
    monkeypatch.undo()
    monkeypatch.setattr(resolution, "kind_table", lambda *a: reads.append(1) or real_table(*a))

    changes = {
        "a benchmark on this GPU": f"""checks.record_benchmark(s, {sm86}, project="", shape_key="opt", shapes={{}},
            machine={{}}, gpu_name={GPU!r}, compute_capability="8.6",
            stats={{"e2e": {{"median": 3.25, "p99": 4.0}}}})""",
        "an accuracy result": f"""checks.record_verdict(s, {sm86}, "", {{"pass": True}})""",
        "a new engine": f"""catalog_engine(s, s.get(ModelRow, {model_id}), "sm80")""",
        "a new version": f"""catalog_model(s, {name!r}, uuid.uuid4().hex * 2, version="2", seq=2)""",
    }
    seen = {tag}
    for what, code in changes.items():
        before = len(reads)
        elsewhere(settings, code)
        r = fresh(http, params, tag)
        assert r.status_code == 200, (what, r.status_code, r.text[:200])
        assert r.headers["etag"] not in seen, what
        assert len(reads) == before + 1, what  # the engines' kinds were read and judged again
        seen.add(tag := r.headers["etag"])
        if what == "a benchmark on this GPU":
            explained = http.get("/v1/resolve", params=params | {"explain": True}).json()
            assert explained["candidates"][0]["latency_ms"] == 3.25
        if what == "an accuracy result":
            assert r.json()["accuracy"] == "pass"
        if what == "a new engine":
            assert r.json()["excluded"] == {k: v + 1 for k, v in first.json()["excluded"].items()}
        if what == "a new version":
            assert r.json()["engine"]["model_version"] == "1"
    assert [f["engine_id"] for f in first.json()["fallbacks"]] == [cpu]


def test_another_projects_verdict_moves_nothing_here_and_its_table_is_its_own(farm):
    settings, http = farm
    name = unique_name("tables")
    with session_scope(settings) as s:
        model = catalog_model(s, name, uuid.uuid4().hex * 2)
        sm86 = catalog_engine(s, model, "sm86")
    params = QUERY | {"model": name}
    first = http.get("/v1/resolve", params=params)
    assert first.status_code == 200 and first.json()["accuracy"] == "unchecked"
    elsewhere(settings, f"""checks.record_verdict(s, {sm86}, "someone-else", {{"pass": False}})""")
    again = http.get("/v1/resolve", params=params)
    # The verdict raised the generation (the tag moves) but this project's answer is the same.
    assert again.status_code == 200 and again.json()["accuracy"] == "unchecked"
    assert again.json()["engine"]["id"] == sm86


def test_the_embedded_catalogs_feed_moves_with_a_commit_from_another_connection(tmp_path):
    settings = Settings(data_dir=tmp_path, reconcile_seconds=0, gc_interval_seconds=0)
    with TestClient(create_app(settings)):
        pass  # migrated
    feed = changes_for(settings.resolved_database_url)
    try:
        before = feed.current()
        assert before is not None and feed.current() == before
        versions = Versions(60, changes=feed)
        versions.put(("m", None, None), ["row"], versions.stamp())
        assert versions.get(("m", None, None)) == ["row"]
        elsewhere(settings, """catalog_model(s, "embedded", uuid.uuid4().hex * 2)""")
        assert feed.current() != before
        assert versions.get(("m", None, None)) is None
    finally:
        feed.stop()


def test_a_feed_that_is_down_trusts_nothing(own_pg):
    feed = changes_for(own_pg.replace("127.0.0.1:5432", "127.0.0.1:1"))
    try:
        versions = Versions(60, changes=feed)
        versions.put(("m", None, None), ["row"], versions.stamp())
        assert feed.current() is None and versions.get(("m", None, None)) is None
    finally:
        feed.stop()
