"""Downloads as registries serve content-addressed bytes: ETag = sha256, private and immutable, 304 to
If-None-Match, Range as RFC 9110 says (206, 416, or the whole blob for a range it lets a server ignore) alike from a
local and an S3 store, a 307 to a presigned URL with S3 (or streamed through the API when that is off), and a
client that follows the redirect, verifies the sha256 and resumes a download whose connection broke."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from api.app import create_app
from enginefarm.client import Client
from enginefarm.core.config import Settings
from enginefarm.graph.samples import conv_net
from server.embedded import free_port, issue_token
from tests.helpers import unique_name


@contextmanager
def serve(settings: Settings):
    """The API in this process on a free port (uvicorn in a thread); yields (url, admin token)."""
    token = issue_token(settings, "downloads", ["admin"])
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=free_port(), log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.config.port}", token
    finally:
        server.should_exit = True
        thread.join(30)


class CuttingProxy:
    """A TCP proxy whose first ``cuts`` connections are closed once ``after`` bytes of the answer have passed."""

    def __init__(self, target_port: int, after: int, cuts: int = 1):
        self.target, self.after, self.cuts = ("127.0.0.1", target_port), after, cuts
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            limit = self.after if self.connections <= self.cuts else None
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, limit), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if limit is not None and sent + len(data) >= limit:
                    dst.sendall(data[: limit - sent])
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def local_farm(tmp_path_factory):
    """A farm on a local blob store (SQLite catalog), with one model of about 1.5 MB."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("local-farm"), reconcile_seconds=0, gc_interval_seconds=0)
    data = conv_net(channels=128, blocks=6, seed=7).SerializeToString()
    with serve(settings) as (url, token), Client(url, token=token) as c:
        model, _ = c.upload(data, name="dl")
        yield url, token, model, data


def _s3_farm(seaweedfs: str, data_dir, redirect: bool):
    settings = Settings(
        data_dir=data_dir,
        reconcile_seconds=0,
        gc_interval_seconds=0,
        blob_store="s3",
        s3_endpoint_url=seaweedfs,
        s3_bucket=f"dl-{time.time_ns()}",
        s3_access_key="k",
        s3_secret_key="s",
        download_redirect=redirect,
    )
    data = conv_net(seed=778).SerializeToString()
    with serve(settings) as (url, token), Client(url, token=token) as c:
        model, _ = c.upload(data, name="streamed")
        yield url, token, model, data


@pytest.fixture(scope="module")
def s3_farm(seaweedfs, tmp_path_factory):
    """A farm on an S3 store (SeaweedFS) that streams downloads through the API, with one small model."""
    yield from _s3_farm(seaweedfs, tmp_path_factory.mktemp("s3-farm"), redirect=False)


@pytest.fixture(scope="module")
def s3_redirect_farm(seaweedfs, tmp_path_factory):
    """The same on an S3 store that redirects downloads to presigned URLs (the default)."""
    yield from _s3_farm(seaweedfs, tmp_path_factory.mktemp("s3-redirect-farm"), redirect=True)


def test_content_is_private_immutable_and_answers_if_none_match_with_304(local_farm):
    url, token, model, data = local_farm
    sha = hashlib.sha256(data).hexdigest()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
        r = http.get(f"/v1/models/{model['id']}/content")
        assert r.status_code == 200 and r.content == data
        assert r.headers["etag"] == f'"{sha}"' and r.headers["x-content-sha256"] == sha
        # The client's own cache keeps it for good; a shared one must not (tests/e2e/api/test_shared_cache.py).
        assert r.headers["cache-control"] == "private, max-age=31536000, immutable"
        assert r.headers["vary"] == "Authorization" and r.headers["accept-ranges"] == "bytes"
        again = http.get(f"/v1/models/{model['id']}/content", headers={"If-None-Match": f'"{sha}"'})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == f'"{sha}"'
        assert again.headers["cache-control"] == r.headers["cache-control"]
        other = http.get(f"/v1/models/{model['id']}/content", headers={"If-None-Match": '"0000"'})
        assert other.status_code == 200 and other.content == data


# (Range, If-Range, status, the bytes: a slice of the blob, None for the whole). RFC 9110 14.2: a range that is
# invalid (last before first), several ranges and another unit may be ignored: the whole blob, never a 400.
RANGES = [
    ("bytes=10-19", None, 206, slice(10, 20)),
    ("bytes=-5", None, 206, slice(-5, None)),
    ("bytes=100-", None, 206, slice(100, None)),
    ("bytes=0-999999999", None, 206, slice(0, None)),
    ("BYTES=10-19", None, 206, slice(10, 20)),  # the unit is case-insensitive
    ("bytes=5-2", None, 200, None),
    ("bytes=0-1,5-6", None, 200, None),
    ("items=0-5", None, 200, None),
    ("bytes=ten-", None, 200, None),
    ("bytes=-", None, 200, None),
    ("bytes=10-19", '"not-this-blob"', 200, None),  # If-Range that does not match: the whole blob
    ("bytes=10-19", "Wed, 21 Oct 2015 07:28:00 GMT", 200, None),
    ("bytes=10-19", "ETAG", 206, slice(10, 20)),
    ("bytes=SIZE-", None, 416, None),  # starts past the end: unsatisfiable
    ("bytes=SIZE0-SIZE9", None, 416, None),
    ("bytes=-0", None, 416, None),  # the last 0 bytes
]


@pytest.mark.parametrize("store", ["local_farm", "s3_farm", "s3_redirect_farm"])
@pytest.mark.parametrize("asked,if_range,status,part", RANGES)
def test_range_answers_as_rfc_9110_says_from_every_store(request, store, asked, if_range, status, part):
    """The same answers whoever serves the bytes: the API, or S3 after a redirect (the client sends its Range
    there again)."""
    url, token, model, data = request.getfixturevalue(store)
    size = len(data)
    headers = {
        "Authorization": f"Bearer {token}",
        "Range": asked.replace("SIZE0", str(size)).replace("SIZE9", str(size + 9)).replace("SIZE", str(size)),
    }
    if if_range:
        headers["If-Range"] = if_range.replace("ETAG", f'"{model["sha256"]}"')
    r = httpx.get(f"{url}/v1/models/{model['id']}/content", headers=headers, timeout=60, follow_redirects=True)
    assert r.status_code == status, (r.status_code, r.text[:200], [h.status_code for h in r.history])
    if status == 206:
        expected = data[part]
        first = part.start % size if part.start is not None else 0
        assert (
            r.content == expected and r.headers["content-range"] == f"bytes {first}-{first + len(expected) - 1}/{size}"
        )
        assert r.headers["content-length"] == str(len(expected))
    elif status == 200:
        assert r.content == data and "content-range" not in r.headers
    else:
        assert r.headers["content-range"] == f"bytes */{size}"
    assert (r.history[0] if r.history else r).headers["x-content-sha256"] == model["sha256"]
    if store == "s3_redirect_farm":  # S3 serves the whole blob and plain ranges; the API answers the rest itself
        assert bool(r.history) == (status == 206 and not if_range and asked.startswith("bytes=")), r.history


def test_the_client_resumes_a_download_whose_connection_broke(local_farm, tmp_path):
    url, token, model, data = local_farm
    proxy = CuttingProxy(int(url.rsplit(":", 1)[1]), after=300_000, cuts=2)
    written = []
    try:
        with Client(proxy.url, token=token) as c:
            sha = c._download(f"/v1/models/{model['id']}/content", tmp_path / "m.onnx", model["sha256"], written.append)
    finally:
        proxy.close()
    assert sha == model["sha256"] and (tmp_path / "m.onnx").read_bytes() == data
    assert proxy.connections == 3  # cut twice, resumed twice
    assert sum(written) == len(data)  # resumed from where each cut stopped: no byte was fetched twice
    assert list(tmp_path.iterdir()) == [tmp_path / "m.onnx"]


def test_s3_downloads_redirect_to_a_presigned_url_the_client_follows(farm, tmp_path):
    data = conv_net(seed=777).SerializeToString()
    with Client(farm.url, token=farm.token) as c:
        model, _ = c.upload(data, name=unique_name("presigned"))
        r = c.http.get(f"/v1/models/{model['id']}/content")
        assert r.status_code == 307 and r.headers["x-content-sha256"] == model["sha256"]
        assert "Signature=" in r.headers["location"]
        # Kept only by the client, and for less than the presigned URL lives (300 s by default).
        assert r.headers["cache-control"] == "private, max-age=150" and r.headers["vary"] == "Authorization"
        direct = httpx.get(r.headers["location"], timeout=30)  # no token: the URL itself is the grant
        assert direct.status_code == 200 and direct.content == data
        assert f'filename="{model["name"]}-1.onnx"' in direct.headers.get("content-disposition", "")
        assert c.download_model(model["id"], tmp_path / "m.onnx", model["sha256"]) == model["sha256"]
        cut = c.http.get(f"/v1/models/{model['id']}/content", headers={"If-None-Match": f'"{model["sha256"]}"'})
        assert cut.status_code == 304


def test_s3_downloads_stream_through_the_api_when_redirects_are_off(s3_farm):
    url, token, model, data = s3_farm
    with Client(url, token=token) as c:
        whole = c.http.get(f"/v1/models/{model['id']}/content")
        part = c.http.get(f"/v1/models/{model['id']}/content", headers={"Range": "bytes=5-104"})
    assert whole.status_code == 200 and whole.content == data
    assert whole.headers["cache-control"] == "private, max-age=31536000, immutable"
    assert part.status_code == 206 and part.content == data[5:105]
    assert part.headers["content-range"] == f"bytes 5-104/{len(data)}"
