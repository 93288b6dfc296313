"""Serving a blob as registries serve content-addressed, immutable bytes.

- ``ETag`` is the sha256 (also in ``X-Content-SHA256``), with ``Cache-Control: private, immutable`` (the answer
  depends on the token, so no shared cache may keep it): ``If-None-Match`` gets a 304 with no read of the store.
- ``Range`` as RFC 9110 says, the same for every store: one satisfiable range is a 206, one that starts past the
  end a 416, and one the server may ignore (invalid, several, another unit, a non-matching ``If-Range``) the whole.
- A local store's whole file is served as a file (sendfile where the server offers it).
- An S3 store answers with a 307 to a short-lived presigned URL (``ENGINEFARM_DOWNLOAD_REDIRECT=false`` streams
  through the API instead); the redirect may be kept by the client for half the URL's life. A range to serve is
  redirected too; a range to ignore or refuse, or one with ``If-Range``, is answered here.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Generator
from typing import Literal

import anyio
from fastapi import Request, Response
from fastapi.responses import FileResponse, RedirectResponse, StreamingResponse
from sqlalchemy.orm import Session
from starlette.types import Receive, Scope, Send

from enginefarm.core.config import Settings
from enginefarm.core.errors import NotFound
from enginefarm.core.hashing import SHA_HEADER
from storage import builtengines
from storage.blobs import get_blob_store

IMMUTABLE = "private, max-age=31536000, immutable"
# Streams read their chunks on threads of their own: on the shared pool they queued behind the routes.
_STREAMS = anyio.CapacityLimiter(64)
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$", re.IGNORECASE)
_S3_RANGE = re.compile(r"bytes=\d*-\d*")


def redirect_cache_control(url_ttl_s: int) -> str:
    """A presigned URL's redirect is fresh for half the URL's life: a client following it from its cache still
    finds the URL valid."""
    return f"private, max-age={url_ttl_s // 2}"


def blob_response(request: Request, settings: Settings, key: str, sha256: str, filename: str) -> Response:
    """The blob's bytes (or a 304, a 206, a 416, a 307) with its sha256 for the client to check. Raises NotFound
    (before any byte is sent) when the store has lost it."""
    etag = f'"{sha256}"'
    # Vary as well as private: a cache that ignores private still keeps one token's answer from another.
    headers = {
        SHA_HEADER: sha256,
        "ETag": etag,
        "Cache-Control": IMMUTABLE,
        "Vary": "Authorization",
        "Accept-Ranges": "bytes",
    }
    held = {t.strip() for t in request.headers.get("if-none-match", "").split(",")}
    if held & {etag, f"W/{etag}", "*"}:
        return Response(status_code=304, headers=headers)
    store = get_blob_store(settings)
    size = store.size(key)  # raises NotFound before any byte is sent, or any client is sent elsewhere
    asked, if_range = request.headers.get("range"), request.headers.get("if-range")
    # If-Range (RFC 9110 13.1.5): the range only while the client's copy is this blob; a date never matches.
    span = _span(asked, size) if if_range in (None, etag) else None
    # Sent to S3 are the whole blob and a range to serve, as S3 reads it; anything else is answered here, as S3
    # servers differ where RFC 9110 leaves a choice (SeaweedFS: 416 to bytes=5-2, and to BYTES=10-19) and judge
    # If-Range by their own ETag.
    plain_range = isinstance(span, tuple) and if_range is None and _S3_RANGE.fullmatch(asked or "") is not None
    if (
        settings.download_redirect
        and (asked is None or plain_range)
        and (url := store.download_url(key, settings.download_url_ttl_s, filename))
    ):
        return RedirectResponse(
            url,
            status_code=307,
            headers={**headers, "Cache-Control": redirect_cache_control(settings.download_url_ttl_s)},
        )
    disposition = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if span is False:
        return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    if span is None:
        if (path := store.local_path(key)) is not None:
            return _WholeFile(path, media_type="application/octet-stream", headers={**headers, **disposition})
        return StreamingResponse(
            _off_the_route_threads(store.iter_chunks(key)),
            media_type="application/octet-stream",
            headers={**headers, **disposition, "Content-Length": str(size)},
        )
    start, end = span
    return StreamingResponse(
        _off_the_route_threads(store.iter_chunks(key, start=start, end=end)),
        status_code=206,
        media_type="application/octet-stream",
        headers={
            **headers,
            **disposition,
            "Content-Length": str(end - start + 1),
            "Content-Range": f"bytes {start}-{end}/{size}",
        },
    )


def _span(header: str | None, size: int) -> tuple[int, int] | None | Literal[False]:
    """The one byte range a Range header asks for (first and last byte); None for the whole blob; False when
    it cannot be satisfied (RFC 9110 14.1.1: it starts past the end, or asks for the last 0 bytes).

    None where RFC 9110 14.2 lets a server ignore the header: no header, another unit, several ranges, and
    an invalid range (bad syntax, or a last byte before the first, as ``bytes=5-2``)."""
    match = _RANGE.match((header or "").strip())
    if not match or not (match[1] or match[2]):
        return None
    if not match[1]:  # bytes=-N: the last N
        suffix = int(match[2])
        return (max(0, size - suffix), size - 1) if suffix > 0 and size > 0 else False
    start = int(match[1])
    if match[2] and int(match[2]) < start:
        return None
    if start >= size:
        return False
    return start, min(int(match[2]), size - 1) if match[2] else size - 1


class _WholeFile(FileResponse):
    """A local blob's whole file. The Range header was judged above and ignored, so FileResponse must not judge
    it again (it answers 400 to a range RFC 9110 says to ignore, and several ranges as multipart)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"range", b"if-range")]
        await super().__call__({**scope, "headers": headers}, receive, send)


async def _off_the_route_threads(chunks: Generator[bytes, None, None]) -> AsyncIterator[bytes]:
    try:
        while (chunk := await anyio.to_thread.run_sync(next, chunks, None, limiter=_STREAMS)) is not None:
            yield chunk
    finally:
        with anyio.CancelScope(shield=True):  # a client that hung up: still give the S3 connection back
            await anyio.to_thread.run_sync(chunks.close, limiter=_STREAMS)


def engine_content(
    request: Request, session: Session, settings: Settings, engine_id: int, project: str | None
) -> Response:
    """The engine's bytes, with their sha256 for the client to check (ETag; 304 to If-None-Match; Range; a 307 to
    S3 where the store is S3)."""
    row, model = builtengines.engine_in_project(session, engine_id, project)
    suffix = "onnx" if row.backend == "onnxruntime" else "plan"
    filename = f"{model.name}-{model.version}-{row.target.replace('/', '-')}.{suffix}"
    try:
        return blob_response(request, settings, row.blob_key, row.sha256, filename)
    except NotFound:
        raise NotFound(
            f"the bytes of engine {row.id} ({row.target}, sha256 {row.sha256}) are missing from the blob "
            "store; the farm's operator can see every missing blob with `enginefarm gc --dry-run`"
        ) from None
