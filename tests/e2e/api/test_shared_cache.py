"""The API behind a real shared cache (nginx with proxy_cache, tests/proxy.py) in front of the real farm.

A shared cache keys what it keeps by URL, not by token. An answer that it may keep would be handed to the next
client asking for that URL: another project's token, or none, would get the first project's bytes (or its
redirect to them), or its model records, where the API itself answers 404 or 401. Downloads are ``private``, and
/v1 answers that say nothing else ``no-store``, so every request reaches the API. A control upstream shows the same
proxy does keep what it is allowed to, and a 200 that says nothing."""

from __future__ import annotations

import hashlib
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from enginefarm.client import Client
from enginefarm.core.errors import NotFound
from enginefarm.graph.samples import conv_net, sample_spec
from server.embedded import Farm
from tests.helpers import unique_name
from tests.proxy import CACHE_STATUS, CachingProxy

CPU = "onnxruntime/cpu-x86_64"
NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def tenants(farm):
    """Project A with a model and its engine, project B; a read token of each, A's bytes by kind."""
    suffix = uuid.uuid4().hex[:6]
    tokens = {}
    for who, scope in (("a", "build"), ("a", "read"), ("b", "read")):
        made = httpx.post(
            f"{farm.url}/v1/tokens",
            headers=farm.headers,
            timeout=30,
            json={"name": f"cache-{who}-{scope}", "scopes": [scope], "project": f"cache-{who}-{suffix}"},
        )
        assert made.status_code == 201, made.text
        tokens[f"{who}-{scope}"] = made.json()["token"]
    data = conv_net(seed=4244).SerializeToString()
    name = unique_name("cached")
    with Client(farm.url, token=tokens["a-build"]) as a:
        model, _ = a.upload(data, name)
        build = a.build(model["id"], [CPU], {**sample_spec(), **NO_CHECKS})
        task = a.wait_build(build["id"], timeout=300)["tasks"][0]
        assert task["state"] == "succeeded", task
        engine = a.get(f"/v1/engines/{task['engine_id']}")
    return {
        "a": tokens["a-read"],
        "b": tokens["b-read"],
        "model": (f"/v1/models/{model['id']}/content", model["sha256"]),
        "engine": (f"/v1/engines/{engine['id']}/content", engine["sha256"]),
        "records": [
            f"/v1/models/{model['id']}",
            f"/v1/engines/{engine['id']}",
            f"/v1/builds/{build['id']}",
            f"/v1/models/{model['id']}/report",
            f"/v1/models?name={name}",
        ],
    }


@pytest.fixture(scope="module")
def streaming_api(dist_env, farm, tmp_path_factory):
    """A second API process of the same farm (catalog, S3) that streams downloads instead of redirecting."""
    logs = tmp_path_factory.mktemp("streaming-api")
    api = Farm(
        {
            **dist_env,
            "ENGINEFARM_DOWNLOAD_REDIRECT": "false",
            "ENGINEFARM_RECONCILE_SECONDS": "0",
            "ENGINEFARM_GC_INTERVAL_SECONDS": "0",
        },
        log_dir=logs,
    )
    try:
        api.start_api()
        yield api.url
    finally:
        api.stop()


@pytest.fixture(scope="module")
def proxies(farm, streaming_api, tmp_path_factory):
    """A shared cache in front of each API: {"redirect": url, "streamed": url}."""
    work = tmp_path_factory.mktemp("proxies")
    with (
        CachingProxy(farm.url, work / "redirect") as redirecting,
        CachingProxy(streaming_api, work / "streamed") as streamed,
    ):
        yield {"redirect": redirecting.url, "streamed": streamed.url}


class _Public(BaseHTTPRequestHandler):
    """Answers every GET with the number of requests it has had: /public marked as a shared cache may keep it,
    anything else with nothing said about caching."""

    seen = 0

    def do_GET(self) -> None:
        type(self).seen += 1
        body = f"answer {self.seen} for {self.headers.get('Authorization')}".encode()
        self.send_response(200)
        if self.path == "/public":
            self.send_header("Cache-Control", "public, max-age=600")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_the_proxy_is_a_shared_cache_that_keys_by_url_alone(tmp_path):
    """The control: what an upstream marks public, or leaves unmarked, is kept and handed to the next client,
    whatever its token."""
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Public)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with CachingProxy(f"http://127.0.0.1:{upstream.server_port}", tmp_path / "nginx") as proxy:
            answers = {
                path: [
                    httpx.get(f"{proxy.url}{path}", headers=headers, timeout=30)
                    for headers in (bearer("alice"), bearer("bob"), {})
                ]
                for path in ("/public", "/unmarked")
            }
    finally:
        upstream.shutdown()
    for path, (first, second, anonymous) in answers.items():
        assert first.headers[CACHE_STATUS] == "MISS" and first.text.endswith("for Bearer alice"), path
        assert [second.headers[CACHE_STATUS], anonymous.headers[CACHE_STATUS]] == ["HIT", "HIT"], path
        assert second.text == anonymous.text == first.text, path
    assert _Public.seen == 2


@pytest.mark.parametrize("mode", ["streamed", "redirect"])
@pytest.mark.parametrize("kind", ["model", "engine"])
def test_another_project_or_no_token_never_gets_a_projects_download_from_a_shared_cache(
    tenants, proxies, dist_settings, mode, kind
):
    path, sha = tenants[kind]
    with httpx.Client(base_url=proxies[mode], timeout=60, follow_redirects=False) as http:
        mine = http.get(path, headers=bearer(tenants["a"]))
        theirs = http.get(path, headers=bearer(tenants["b"]))
        nobody = http.get(path)
        mine_again = http.get(path, headers=bearer(tenants["a"]))

    # Project A gets its bytes (or its redirect to them), marked for its own cache only.
    assert mine.headers["x-content-sha256"] == sha and mine.headers[CACHE_STATUS] == "MISS"
    assert "private" in mine.headers["cache-control"] and "public" not in mine.headers["cache-control"]
    assert mine.headers["vary"] == "Authorization"
    if mode == "streamed":
        assert mine.status_code == 200 and "immutable" in mine.headers["cache-control"]
        assert mine.headers["etag"] == f'"{sha}"' and hashlib.sha256(mine.content).hexdigest() == sha
    else:
        assert mine.status_code == 307 and "Signature=" in mine.headers["location"]
        max_age = int(re.search(r"max-age=(\d+)", mine.headers["cache-control"])[1])
        assert 0 < max_age < dist_settings.download_url_ttl_s  # never kept past the URL's life

    # B and the anonymous client reach the API itself, which does not know A's ids: no bytes, no redirect.
    assert theirs.status_code == 404 and theirs.headers[CACHE_STATUS] == "MISS", (theirs.status_code, theirs.headers)
    assert "no " in theirs.json()["detail"] and "location" not in theirs.headers
    assert nobody.status_code == 401 and nobody.headers[CACHE_STATUS] == "MISS", (nobody.status_code, nobody.headers)
    assert "location" not in nobody.headers and "x-content-sha256" not in nobody.headers
    # Nor was A's own answer kept: the next one comes from the API too.
    assert mine_again.status_code == mine.status_code and mine_again.headers[CACHE_STATUS] == "MISS"


def test_another_project_or_no_token_never_gets_a_projects_records_from_a_shared_cache(tenants, proxies):
    """/v1 answers that say nothing about caching say no-store: a cache that keeps unmarked 200s keeps none."""
    with httpx.Client(base_url=proxies["redirect"], timeout=60) as http:
        for path in tenants["records"]:
            mine = http.get(path, headers=bearer(tenants["a"]))
            theirs = http.get(path, headers=bearer(tenants["b"]))
            nobody = http.get(path)
            assert nobody.status_code == 401, (path, nobody.status_code, nobody.headers[CACHE_STATUS])
            if "?" in path:  # a listing: B's own, empty
                assert theirs.status_code == 200 and theirs.json()["total"] == 0, (path, theirs.text[:200])
            else:
                assert theirs.status_code == 404, (path, theirs.status_code, theirs.headers[CACHE_STATUS])
            assert theirs.headers[CACHE_STATUS] == nobody.headers[CACHE_STATUS] == "MISS", path
            assert mine.status_code == 200 and mine.headers["cache-control"] == "no-store", (path, mine.headers)


def test_a_build_long_poll_through_a_shared_cache_waits_and_keeps_nothing(tenants, proxies):
    """Waiting for a build through the proxy, as the client waits: nginx's cache drops If-None-Match, so the held tag
    also goes as ``seen``; the farm holds the request for the wait and answers the same build (no 304 reaches a
    client that did not send If-None-Match), which the client reads as "nothing changed". Another project's token
    with the same tag gets its 404 at once."""
    build = next(p for p in tenants["records"] if p.startswith("/v1/builds/"))
    with httpx.Client(base_url=proxies["redirect"], timeout=60) as http:
        first = http.get(build, headers=bearer(tenants["a"]))
        assert first.status_code == 200 and first.headers["cache-control"] == "no-store", first.headers
        tag = first.headers["etag"]
        t0 = time.monotonic()
        waited = http.get(
            build, params={"wait": 1.5, "seen": tag}, headers={**bearer(tenants["a"]), "If-None-Match": tag}
        )
        took = time.monotonic() - t0
    assert waited.status_code == 200 and waited.headers["etag"] == tag, waited.headers
    assert waited.headers[CACHE_STATUS] == "MISS" and waited.headers["cache-control"] == "no-store"
    assert 1.5 <= took < 10, took
    with Client(proxies["redirect"], token=tenants["a"]) as a:
        t0 = time.monotonic()
        assert a.get_changed(build, tag, 1.5) == (None, tag)
        assert time.monotonic() - t0 >= 1.5
    with Client(proxies["redirect"], token=tenants["b"]) as b:
        t0 = time.monotonic()
        with pytest.raises(NotFound):
            b.get_changed(build, tag, 1.5)
        assert time.monotonic() - t0 < 1.0
