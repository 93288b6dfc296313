"""The farm's HTTP connection and the bytes that cross it: requests carry the API token, error answers are raised as
``ApiError``, blobs come down streamed, resumed after a broken connection and verified by sha256 (to a file put in
place atomically, or into the engine cache), and upload bodies report the bytes read. ``Client`` (sdk) makes the
API's calls over it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx

from enginefarm.client.cache import EngineCache
from enginefarm.client.errors import api_error
from enginefarm.client.safepaths import TMP_PREFIX, atomic_write, record_id
from enginefarm.core.config import get_settings
from enginefarm.core.errors import IntegrityError
from enginefarm.core.hashing import CHUNK, SHA_HEADER

_T = TypeVar("_T", bound="Transport")


class ProgressReader:
    """A file wrapper that reports bytes read, so uploads can drive a progress bar."""

    def __init__(self, path: Path, on_bytes: Callable[[int], None] | None):
        self._fh = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._on_bytes = on_bytes

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size if size and size > 0 else CHUNK)
        if self._on_bytes and data:
            self._on_bytes(len(data))
        return data

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read(CHUNK):
            yield chunk

    def close(self) -> None:
        self._fh.close()


class Transport:
    """A connection to one farm (``base_url``, default the settings' ``api_url``) and the transfers over it."""

    def __init__(self, base_url: str | None = None, timeout: float = 60.0, token: str | None = None):
        """``token``: the API token sent with every request (default: ``ENGINEFARM_TOKEN``)."""
        self.base_url = (base_url or get_settings().api_url).rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):  # httpx would send it nowhere and say "://"
            raise ValueError(
                f"the farm's URL {self.base_url!r} (--api or ENGINEFARM_API_URL) needs its scheme: "
                f"http://{self.base_url.split('://')[-1]}"
            )
        token = token or os.environ.get("ENGINEFARM_TOKEN")
        self.http = httpx.Client(
            base_url=self.base_url, timeout=timeout, headers={"Authorization": f"Bearer {token}"} if token else None
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = response.text
            raise api_error(response.status_code, body, response.headers.get("retry-after"))
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        return self._json(self.http.get(path, params={k: v for k, v in params.items() if v is not None}))

    def get_changed(self, path: str, held: str | None, wait: float) -> tuple[Any, str | None]:
        """A long poll: the answer at ``path`` once it differs from the one whose ETag is ``held``, waiting up to
        ``wait`` seconds at the farm. Returns the answer and its ETag, or (None, held) when nothing changed: a
        304, or the same answer again (a caching proxy that drops If-None-Match passes the tag on as ``seen``
        instead); (None, None) when nothing changed but the farm did not wait (something in between answered). A
        tag of None means the next request would not wait either (so is a farm that sends no ETag): the caller
        waits before asking again."""
        started = time.monotonic()
        if held is None or wait <= 0:
            response = self.http.get(path)
        else:
            response = self.http.get(
                path,
                params={"wait": f"{wait:.3f}", "seen": held},
                headers={"If-None-Match": held},
                timeout=wait + 30,
            )
        waited = time.monotonic() - started >= wait / 2
        if response.status_code == 304:
            return None, held if waited else None
        answer, tag = self._json(response), response.headers.get("etag")
        if held is not None and tag == held:
            return None, held if waited else None
        return answer, tag

    # ------------------------------------------------------------------ downloads

    def _stream(self, url: str, out: Any, on_bytes: Callable[[int], None] | None, attempts: int = 4) -> None:
        """Write a blob's bytes to ``out`` (a HashingWriter), checked against the sha256 the farm sends in its header.

        Follows the farm's redirect to S3 (httpx drops the token on the way to another host). A connection that
        breaks mid-download is resumed from the bytes already written (``Range``), up to ``attempts`` times; a
        server that answers a resume with the whole blob is read from the start again."""
        header = None
        for attempt in range(attempts):
            ranged = {"Range": f"bytes={out.size}-"} if out.size else {}
            try:
                with self.http.stream("GET", url, headers=ranged, timeout=None, follow_redirects=True) as r:
                    if r.status_code >= 400:
                        r.read()
                        self._json(r)
                    header = r.headers.get(SHA_HEADER) or header
                    if ranged and r.status_code != 206:
                        out.restart()
                    elif ranged:
                        _check_resumed(url, r, out.size)
                    for chunk in r.iter_bytes(CHUNK):
                        out.write(chunk)
                        if on_bytes:
                            on_bytes(len(chunk))
                    _check_length(url, r)
                    break
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.ConnectError):
                if attempt == attempts - 1:
                    raise
                time.sleep(min(0.5 * 2**attempt, 5))
        if header and out.hexdigest() != header:
            raise IntegrityError(f"{url}: downloaded sha256 {out.hexdigest()}, the server says {header}")

    def _download(
        self,
        url: str,
        dest: Path,
        expected_sha256: str | None,
        on_bytes: Callable[[int], None] | None,
        *,
        size: int | None = None,
        verify: Callable[[Path], None] | None = None,
    ) -> str:
        """Stream ``url`` to ``dest`` atomically (``safepaths.atomic_write``): its sha256 must match
        ``expected_sha256`` and the server's header, its size ``size`` (when known), and ``verify`` must pass on the
        temporary file; otherwise nothing is left at ``dest`` or beside it."""
        dest = Path(dest)
        with atomic_write(dest, expected_sha256, prefix=f".{dest.name}{TMP_PREFIX}", size=size, verify=verify) as out:
            self._stream(url, out, on_bytes)
        return out.hexdigest()

    def download(
        self,
        engine_id: int,
        dest: Path,
        expected_sha256: str | None = None,
        on_bytes: Callable[[int], None] | None = None,
        *,
        size: int | None = None,
        verify: Callable[[Path], None] | None = None,
    ) -> str:
        """Download an engine to ``dest`` atomically, verifying its sha256 (and ``size``, and ``verify`` on the bytes
        before they take the name); returns the sha256."""
        url = f"/v1/engines/{record_id(engine_id, 'the engine')}/content"
        return self._download(url, dest, expected_sha256, on_bytes, size=size, verify=verify)

    def download_model(
        self, model_id: int, dest: Path, expected_sha256: str | None = None, *, size: int | None = None
    ) -> str:
        """Download a model as it was uploaded (.onnx or bundle), atomically and verified."""
        url = f"/v1/models/{record_id(model_id, 'the model')}/content"
        return self._download(url, dest, expected_sha256, None, size=size)

    def download_reference(self, engine_id: int, dest: Path) -> dict[str, Any]:
        """The reference outputs a deploy machine checks an engine against (``enginefarm.measure.check``): their
        record (the limits of the engine's gate), with the .npz at ``dest``, atomically and verified."""
        eid = record_id(engine_id, "the engine")
        record = cast("dict[str, Any]", self.get(f"/v1/engines/{eid}/reference"))
        self._download(f"/v1/engines/{eid}/reference/content", dest, record["sha256"], None, size=size_of(record))
        return record

    def cached(
        self, engine: dict[str, Any], cache: EngineCache, on_bytes: Callable[[int], None] | None = None
    ) -> tuple[Path, bool]:
        """Make sure ``engine`` (a catalog record) is in the cache; returns (its path there, whether it already was)."""
        sha = engine["sha256"]
        hit = cache.has(sha)
        if not hit:
            url = f"/v1/engines/{record_id(engine.get('id'), 'the engine')}/content"
            with cache.writer(sha, size_of(engine)) as out:
                self._stream(url, out, on_bytes)
        cache.remember(engine, self.base_url)
        return cache.path(sha), hit


def size_of(record: Mapping[str, Any]) -> int | None:
    """The size in bytes a catalog record gives its file, where it gives one."""
    size = record.get("size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


def _check_length(url: str, response: httpx.Response) -> None:
    """The bytes that came (before any decoding) must be the Content-Length the answer declared."""
    declared = response.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) != response.num_bytes_downloaded):
        raise IntegrityError(
            f"{url}: the farm declared Content-Length {declared} and sent {response.num_bytes_downloaded} bytes"
        )


def _check_resumed(url: str, response: httpx.Response, have: int) -> None:
    """A resumed download's part must start where the bytes already written end."""
    unit, _, span = response.headers.get("content-range", "").partition(" ")
    first = span.partition("-")[0]
    if unit != "bytes" or not first.isdigit() or int(first) != have:
        raise IntegrityError(f"{url}: asked to resume at byte {have}, the farm sent {unit} {span or 'no range'}")
