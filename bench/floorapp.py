"""The HTTP server's own floor: a bare ASGI app served exactly as the farm's API is (``serve_api``: the same
uvicorn protocol, header timeout, proxy headers and TCP_NODELAY socket), answering GET with a 4.5 KB JSON body,
or a 304 when the request carries If-None-Match. bench/fleet.py measures it beside the farm, so a cached answer
and a 304 can be read against what any app under this server costs.

    python -m bench.floorapp --port 18555 --workers 2
"""

from __future__ import annotations

import argparse

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
    if any(name == b"if-none-match" for name, _ in scope["headers"]):
        await send({"type": "http.response.start", "status": 304, "headers": NOT_MODIFIED})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": FULL})
    await send({"type": "http.response.body", "body": BODY})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    from enginefarm.server.serve import serve_api

    serve_api("127.0.0.1", args.port, args.workers, log_level="warning", app="bench.floorapp:app")


if __name__ == "__main__":
    main()
