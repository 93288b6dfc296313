"""Serving a blob as registries serve content-addressed, immutable bytes.

- ``ETag`` is the sha256 (also in ``X-Content-SHA256``), with ``Cache-Control: immutable``: a client or a proxy
  that holds the bytes asks with ``If-None-Match`` and gets a 304 with no body and no read of the store.
- ``Range`` requests are answered with 206, so an interrupted download resumes where it stopped.
- A local store's file is served as a file (``FileResponse``: sendfile where the server offers it).
- An S3 store answers with a 307 to a short-lived presigned URL by default, as OCI registries do, so the bytes
  never pass through the API; ``ENGINEFARM_DOWNLOAD_REDIRECT=false`` streams them through the API instead, for
  deployments whose clients cannot reach S3.
"""

from __future__ import annotations

import re
from typing import AsyncIterator, Iterator

import anyio
from fastapi import Request, Response
from fastapi.responses import FileResponse, RedirectResponse, StreamingResponse

from enginefarm.config import Settings
from enginefarm.hashing import SHA_HEADER
from enginefarm.storage.blobs import get_blob_store

IMMUTABLE = "public, max-age=31536000, immutable"
# Streams read their chunks on threads of their own: on the shared pool they queued behind the routes.
_STREAMS = anyio.CapacityLimiter(64)
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def blob_response(request: Request, settings: Settings, key: str, sha256: str, filename: str) -> Response:
    """The blob's bytes (or a 304, a 206, a 307) with its sha256 for the client to check. Raises NotFound
    (before any byte is sent) when the store has lost it."""
    etag = f'"{sha256}"'
    headers = {SHA_HEADER: sha256, "ETag": etag, "Cache-Control": IMMUTABLE, "Accept-Ranges": "bytes"}
    held = {t.strip() for t in request.headers.get("if-none-match", "").split(",")}
    if held & {etag, f"W/{etag}", "*"}:
        return Response(status_code=304, headers=headers)
    store = get_blob_store(settings)
    disposition = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if (path := store.local_path(key)) is not None:
        return FileResponse(path, media_type="application/octet-stream", headers={**headers, **disposition})
    size = store.size(key)  # raises NotFound before any byte is sent, or any client is sent elsewhere
    if settings.download_redirect and (url := store.download_url(key, settings.download_url_ttl_s, filename)):
        return RedirectResponse(url, status_code=307, headers=headers)
    span = _span(request.headers.get("range"), size)
    if span is None:
        return StreamingResponse(_off_the_route_threads(store.iter_chunks(key)), media_type="application/octet-stream",
                                 headers={**headers, **disposition, "Content-Length": str(size)})
    if span is False:
        return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    start, end = span
    return StreamingResponse(_off_the_route_threads(store.iter_chunks(key, start=start, end=end)), status_code=206,
                             media_type="application/octet-stream",
                             headers={**headers, **disposition, "Content-Length": str(end - start + 1),
                                      "Content-Range": f"bytes {start}-{end}/{size}"})


def _span(header: str | None, size: int) -> tuple[int, int] | None | bool:
    """The one byte range a Range header asks for; None for the whole blob (no header, or one we do not
    take: several ranges); False when it cannot be satisfied."""
    match = _RANGE.match((header or "").strip())
    if not match or not (match[1] or match[2]):
        return None
    if not match[1]:  # bytes=-N: the last N
        start, end = max(0, size - int(match[2])), size - 1
    else:
        start, end = int(match[1]), min(int(match[2]), size - 1) if match[2] else size - 1
    return (start, end) if start <= end and start < size else False


async def _off_the_route_threads(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    try:
        while (chunk := await anyio.to_thread.run_sync(next, chunks, None, limiter=_STREAMS)) is not None:
            yield chunk
    finally:
        with anyio.CancelScope(shield=True):  # a client that hung up: still give the S3 connection back
            await anyio.to_thread.run_sync(chunks.close, limiter=_STREAMS)
