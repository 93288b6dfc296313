"""Request bodies are bounded however they are sent, uploads are admitted per token and dropped when idle, and
trouble with disks and stored bytes gets a clear answer: against real API processes (PostgreSQL + SeaweedFS,
and an embedded one whose work and blob directories are small tmpfs mounts)."""

from __future__ import annotations

import hashlib
import http.client
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginefarm.core.config import Settings
from enginefarm.graph.samples import conv_net
from server.embedded import Farm, embedded_env, issue_token
from storage import catalog
from storage.blobs import model_key
from storage.db import session_scope
from tests.corpus.bodies import npz_claiming_shape
from tests.helpers import unique_name

BOUNDARY = "b0dyL1mits"
IDLE_S = 3.0
PER_TOKEN = 2


# --------------------------------------------------------------------------- a raw HTTP client


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str
    sent: int  # body bytes written before the server answered or closed


def _field(name: str, value: bytes) -> bytes:
    return (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n').encode() + value + b"\r\n"


def _file_head(filename: str = "m.onnx") -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n"
    ).encode()


def _open(url: str, path: str, token: str, length: int | None) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n{framing}\r\n\r\n".encode()
    )
    return sock


def _read_answer(sock: socket.socket, sent: int) -> Answer:
    response = http.client.HTTPResponse(sock)
    response.begin()
    body = response.read().decode(errors="replace")
    return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, body, sent)


def post_chunked(url: str, path: str, token: str, chunks: Iterable[bytes]) -> Answer:
    """Send ``chunks`` as a chunked body (no Content-Length), stopping as soon as the server answers or closes."""
    sock = _open(url, path, token, None)
    sent = 0
    try:
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered before the body ended
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        else:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        return _read_answer(sock, sent)
    finally:
        sock.close()


class Drip:
    """An upload that has begun (its file part is open) and sends one byte every half second until stopped."""

    def __init__(self, url: str, token: str, path: str = "/v1/models"):
        self.sock = _open(url, path, token, 1 << 20)
        self.sock.sendall(_field("name", unique_name("drip").encode()) + _file_head() + b"\x08")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, daemon=True)
        self._thread.start()

    def _drip(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.sock.sendall(b"\x00")
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def spool_files(settings: Settings) -> set[Path]:
    return set((settings.work_dir / "uploads").glob("upload-*"))


def wait_for(check, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout} s")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def model_bytes(seed: int) -> bytes:
    return conv_net(seed=seed).SerializeToString()


# --------------------------------------------------------------------------- an API with low upload limits


@pytest.fixture(scope="module")
def limited(dist_env, dist_settings, tmp_path_factory):
    """A second API process on the test farm's catalog and bucket, with a short idle timeout and two uploads in
    flight per token; it runs no reconciler. ``tokens``: two build tokens."""
    logs = tmp_path_factory.mktemp("limited-api")
    env = {
        **dist_env,
        "ENGINEFARM_RECONCILE_SECONDS": "0",
        "ENGINEFARM_UPLOAD_IDLE_TIMEOUT_S": str(IDLE_S),
        "ENGINEFARM_MAX_UPLOADS_PER_TOKEN": str(PER_TOKEN),
    }
    f = Farm(env, log_dir=logs)
    f.tokens = [issue_token(dist_settings, f"limits-{i}", ["build"]) for i in range(2)]
    f.token = f.tokens[0]
    try:
        f.start_api()
        yield f
    finally:
        f.stop()


def _client(farm: Farm, token: str) -> httpx.Client:
    return httpx.Client(base_url=farm.url, timeout=60, headers={"Authorization": f"Bearer {token}"})


# --------------------------------------------------------------------------- bodies bounded by total bytes


def _small_fields(total: int, size: int = 2000) -> Iterator[bytes]:
    """``total`` bytes of distinct small form fields, in 64 KiB chunks."""
    value, chunk, made, i = b"v" * size, bytearray(), 0, 0
    while made < total:
        part = _field(f"f{i}", value)
        chunk += part
        made, i = made + len(part), i + 1
        if len(chunk) >= 64 << 10:
            yield bytes(chunk)
            chunk.clear()
    if chunk:
        yield bytes(chunk)


def test_chunked_small_fields_are_refused_early_and_hold_no_memory(limited):
    """200 MiB of small fields sent chunked: a 413 that names the limit comes before a tenth of it is sent, and the
    API's resident memory does not grow with the body."""
    before = rss_kib(limited.api.pid)
    answer = post_chunked(limited.url, "/v1/models", limited.tokens[0], _small_fields(200 << 20))
    grown_mib = (rss_kib(limited.api.pid) - before) / 1024
    assert answer.status == 413, answer
    assert "ENGINEFARM_MAX_FORM_FIELDS" in answer.body and "32" in answer.body, answer.body
    assert answer.sent < 20 << 20, f"the API read {answer.sent} bytes before refusing"
    assert grown_mib < 48, f"the API's RSS grew by {grown_mib:.0f} MiB"


def test_form_fields_are_bounded_in_total(limited):
    fields = {f"f{i}": "x" * 60_000 for i in range(5)}  # each under 64 KiB, together over 256 KiB
    with _client(limited, limited.tokens[0]) as c:
        r = c.post(
            "/v1/models", data={"name": unique_name("fields"), **fields}, files={"file": ("m.onnx", model_bytes(61))}
        )
    assert r.status_code == 413, r.text
    assert "ENGINEFARM_MAX_FORM_BYTES" in r.json()["detail"] and str(256 << 10) in r.json()["detail"]


def test_chunked_body_past_the_upload_limit_is_refused_while_streaming(limited, dist_settings):
    """A file sent chunked, without a length, is cut off once it passes the upload limit; its spool file goes."""
    before = spool_files(dist_settings)
    limit = dist_settings.max_upload_bytes

    def body() -> Iterator[bytes]:
        yield _field("name", unique_name("chunked").encode()) + _file_head()
        for _ in range(4 * limit // (1 << 20)):
            yield b"\0" * (1 << 20)

    answer = post_chunked(limited.url, "/v1/models", limited.tokens[0], body())
    assert answer.status == 413, answer
    assert "larger than the limit" in answer.body and "ENGINEFARM_MAX_UPLOAD_BYTES" in answer.body
    assert answer.sent < 2 * limit
    wait_for(lambda: spool_files(dist_settings) <= before, 10, "spool file removed")


def test_bytes_outside_any_part_are_bounded(limited):
    """Bytes after the closing boundary (the epilogue), sent chunked, count against the body's limit too."""

    def body() -> Iterator[bytes]:
        yield (
            _field("name", unique_name("epilogue").encode())
            + _file_head()
            + model_bytes(62)
            + f"\r\n--{BOUNDARY}--\r\n".encode()
        )
        for _ in range(400):
            yield b"e" * (1 << 20)

    answer = post_chunked(limited.url, "/v1/models", limited.tokens[0], body())
    assert answer.status == 413, answer
    assert "request body is over" in answer.body, answer.body
    assert answer.sent < 200 << 20


def test_huge_part_headers_are_refused(limited):
    body = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\nX-Pad: '.encode()
        + b"p" * (1 << 20)
        + b"\r\n\r\nv\r\n"
    )
    answer = post_chunked(
        limited.url, "/v1/models", limited.tokens[0], [body[i : i + 65536] for i in range(0, len(body), 65536)]
    )
    assert answer.status == 413, answer
    assert "headers" in answer.body, answer.body


def test_chunked_json_body_is_bounded_while_streaming(limited, dist_settings):
    """A JSON body without a Content-Length is refused once it streams past ENGINEFARM_MAX_JSON_BYTES, with the
    farm's error body."""
    parts = urlsplit(limited.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
    sock.sendall(
        f"POST /v1/builds HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {limited.tokens[0]}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    )
    sent = 0
    try:
        chunk = b'{"model_id": 1, "targets": ["' + b"x" * 65536
        while sent < 64 << 20 and not select.select([sock], [], [], 0)[0]:
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
            chunk = b"x" * 65536
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = _read_answer(sock, sent)
    sock.close()
    assert answer.status == 413, answer
    body = httpx.Response(413, content=answer.body).json()
    assert body["error"] == "PayloadTooLarge", body
    assert f"over the {dist_settings.max_json_bytes} bytes /v1/builds takes" in body["detail"], body
    assert answer.sent < 8 << 20


# --------------------------------------------------------------------------- upload admission


def test_idle_upload_is_dropped_and_its_spool_removed(limited, dist_settings):
    before = spool_files(dist_settings)
    sock = _open(limited.url, "/v1/models", limited.tokens[1], 1 << 20)
    sock.sendall(_field("name", unique_name("idle").encode()) + _file_head() + b"\x08" * 100)
    wait_for(lambda: spool_files(dist_settings) - before, 10, "the upload's spool file")
    started = time.monotonic()
    sock.settimeout(IDLE_S + 20)
    answer = _read_answer(sock, 0)
    sock.close()
    assert answer.status == 408, answer
    assert time.monotonic() - started < IDLE_S + 10
    assert "ENGINEFARM_UPLOAD_IDLE_TIMEOUT_S" in answer.body, answer.body
    wait_for(lambda: spool_files(dist_settings) <= before, 10, "spool file removed")


def test_uploads_in_flight_per_token(limited, dist_settings):
    """Two uploads of one token in flight: its third (a model or samples) gets a 429 naming the limit, another
    token's upload goes through, and once one finishes the token may upload again."""
    first, second = limited.tokens
    with _client(limited, second) as other:
        r = other.post("/v1/models", data={"name": unique_name("other")}, files={"file": ("m.onnx", model_bytes(63))})
        assert r.status_code == 201, r.text
        model_id = r.json()["id"]
    before = spool_files(dist_settings)
    drips = [Drip(limited.url, first) for _ in range(PER_TOKEN)]
    try:
        wait_for(lambda: len(spool_files(dist_settings) - before) >= PER_TOKEN, 20, "both uploads spooling")
        with _client(limited, first) as c:
            refused = c.post(
                "/v1/models", data={"name": unique_name("third")}, files={"file": ("m.onnx", model_bytes(64))}
            )
            samples = c.post(f"/v1/models/{model_id}/samples", files={"file": ("s.npz", b"PK")})
        for r in (refused, samples):
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"].isdigit()
            assert (
                "ENGINEFARM_MAX_UPLOADS_PER_TOKEN" in r.json()["detail"]
                and f"{PER_TOKEN} uploads" in r.json()["detail"]
            )
        with _client(limited, second) as other:
            r = other.post(
                "/v1/models", data={"name": unique_name("other")}, files={"file": ("m.onnx", model_bytes(65))}
            )
            assert r.status_code == 201, r.text
    finally:
        for drip in drips:
            drip.close()
    with _client(limited, first) as c:

        def admitted():
            r = c.post("/v1/models", data={"name": unique_name("again")}, files={"file": ("m.onnx", model_bytes(66))})
            return r if r.status_code != 429 else None

        r = wait_for(admitted, 20, "the token admitted again")
        assert r.status_code == 201, r.text


# --------------------------------------------------------------------------- samples with lying headers


def test_samples_header_claiming_12_tib_is_refused(limited):
    with _client(limited, limited.tokens[1]) as c:
        r = c.post("/v1/models", data={"name": unique_name("npz")}, files={"file": ("m.onnx", model_bytes(67))})
        assert r.status_code == 201, r.text
        r = c.post(
            f"/v1/models/{r.json()['id']}/samples", files={"file": ("s.npz", npz_claiming_shape((1 << 30, 3, 32, 32)))}
        )
    assert r.status_code == 422, r.text
    said = " ".join(p["msg"] for p in r.json().get("problems", []))
    assert "'input'" in said and "[1073741824, 3, 32, 32]" in said and str(12 << 40) in said, r.text


# --------------------------------------------------------------------------- an embedded API on small disks

FREE = 256 << 10  # bytes left free on each small filesystem


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


def _fill(root: Path, leave: int = FREE) -> Path:
    """A file that takes all but ``leave`` bytes of the filesystem under ``root``."""
    filler = root / "filler"
    st = os.statvfs(root)
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


@pytest.fixture(scope="module")
def small_disks(tmp_path_factory):
    """An embedded farm (SQLite, local blobs) whose work and blob directories are 4 MiB tmpfs mounts."""
    data = tmp_path_factory.mktemp("small-disks")
    work, blobs = data / "work", data / "blobs"
    _mount_tmpfs(work, "4m")
    try:
        _mount_tmpfs(blobs, "4m")
        try:
            env = embedded_env(data) | {"ENGINEFARM_RECONCILE_SECONDS": "0"}
            f = Farm(env, log_dir=data, token=issue_token(Settings(data_dir=data), "disks", ["admin"]))
            f.settings, f.work, f.blobs = Settings(data_dir=data), work, blobs
            try:
                f.start_api()
                yield f
            finally:
                f.stop()
        finally:
            subprocess.run(["umount", str(blobs)], check=True)
    finally:
        subprocess.run(["umount", str(work)], check=True)


def _big_model(values: int = 150_000) -> bytes:
    """A valid ONNX model of about 4 bytes per value (one initializer)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, values])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, values])
    w = numpy_helper.from_array(np.random.default_rng(5).standard_normal((1, values)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "big", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _no_leftovers(farm: Farm) -> None:
    assert not list((farm.work / "uploads").glob("upload-*")), "a spool file was left behind"
    assert not list(farm.work.glob("build-*")), "a scratch folder was left behind"
    assert not [p for p in farm.blobs.rglob(".incoming-*")], "a partial blob was left behind"


def _assert_disk_full(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"].isdigit()
    body = r.json()
    assert body["error"] == "StorageFull" and "no space left" in body["detail"].lower(), body


def test_full_work_disk_is_a_503(small_disks):
    filler = _fill(small_disks.work)
    try:
        with httpx.Client(base_url=small_disks.url, headers=small_disks.headers, timeout=60) as c:
            r = c.post("/v1/models", data={"name": unique_name("full")}, files={"file": ("m.onnx", _big_model())})
        _assert_disk_full(r)
        _no_leftovers(small_disks)
    finally:
        filler.unlink()


def test_full_blob_disk_is_a_503_and_stores_nothing(small_disks):
    filler = _fill(small_disks.blobs)
    name, data = unique_name("fullblob"), _big_model()
    try:
        with httpx.Client(base_url=small_disks.url, headers=small_disks.headers, timeout=60) as c:
            r = c.post("/v1/models", data={"name": name}, files={"file": ("m.onnx", data)})
        _assert_disk_full(r)
        _no_leftovers(small_disks)
        assert not (small_disks.blobs / model_key(hashlib.sha256(data).hexdigest())).exists()
        with session_scope(small_disks.settings) as s:
            assert catalog.list_models(s, name=name, limit=1)[1] == 0
    finally:
        filler.unlink()


def test_missing_local_blob_is_a_clear_404(small_disks):
    with httpx.Client(base_url=small_disks.url, headers=small_disks.headers, timeout=60) as c:
        r = c.post("/v1/models", data={"name": unique_name("gone")}, files={"file": ("m.onnx", model_bytes(68))})
        assert r.status_code == 201, r.text
        model = r.json()
        with session_scope(small_disks.settings) as s:
            key = catalog.get_model(s, model["id"]).blob_key
        (small_disks.blobs / key).unlink()
        r = c.get(f"/v1/models/{model['id']}/content")
    assert r.status_code == 404, r.text
    detail = r.json()["detail"]
    assert "missing from the blob store" in detail and "upload" in detail, detail
