"""The HTTP server's own floor: a bare ASGI app served exactly as the farm's API is (``serve_api``: the same
uvicorn protocol, header timeout, proxy headers and TCP_NODELAY socket), answering GET with a 4.5 KB JSON body,
or a 304 when the request carries If-None-Match, and reading a POST's body to drop it. bench/fleet.py measures it
beside the farm, so a cached answer and a 304 can be read against what any app under this server costs, and
bench/upload.py an upload against what the server alone costs to receive its bytes.

    python -m bench.floorapp --port 18555 --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BODY = b'{"answer": "' + b"x" * 4480 + b'"}'
FULL = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
    (b"etag", b'"floor"'),
    (b"cache-control", b"private, no-cache"),
]
NOT_MODIFIED = [(b"etag", b'"floor"'), (b"cache-control", b"private, no-cache")]


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    if scope["method"] == "POST":
        await drain(receive, send)
        return
    if any(name == b"if-none-match" for name, _ in scope["headers"]):
        await send({"type": "http.response.start", "status": 304, "headers": NOT_MODIFIED})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": FULL})
    await send({"type": "http.response.body", "body": BODY})


async def drain(receive, send) -> None:
    """Read the whole body and drop it: what the server itself costs an upload (bench/upload.py), with no parsing,
    hashing or writing. Answers 201 with the byte count."""
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = b'{"bytes": %d, "sha256": ""}' % size
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def served(workers: int = 1) -> Iterator[subprocess.Popen]:
    """This app served on a free port (``serve_api``, ``workers`` processes) for the block; yields its process, whose
    ``port`` attribute is the port. Stopped (its whole process group) at the end."""
    from server import localservers

    port = localservers.free_port_pair()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.floorapp", "--port", str(port), "--workers", str(workers)],
        cwd=Path(__file__).resolve().parents[1],
        start_new_session=True,
    )
    server.port = port  # type: ignore[attr-defined]
    try:
        deadline = time.monotonic() + 60
        while not localservers.port_open(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the floor server did not listen on {port}")
            time.sleep(0.1)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited already (it never listened)
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    from server.serve import serve_api

    serve_api("127.0.0.1", args.port, args.workers, log_level="warning", app="bench.floorapp:app")


if __name__ == "__main__":
    main()
