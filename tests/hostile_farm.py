"""A farm that lies: a real HTTP server (the standard library's, in a thread) whose answers a test writes by hand, for
the client to talk to as it talks to a farm. A route answers JSON, or bytes with an ``X-Content-SHA256`` and a
``Content-Length`` that need not be true; a request no route answers is a 404 as the farm words it.

``tree`` snapshots a folder (every entry, links not followed) so a test can say what a command changed."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Blob:
    data: bytes
    sha256: str | None = None  # the header's; default the bytes' own
    length: int | None = None  # the Content-Length declared; default the true one
    cut: int | None = None  # the first answer stops after this many bytes (a broken connection)
    resume_from: int | None = None  # where a ranged answer says it starts; default where it was asked to
    answers: int = 0


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up on a lie (a Content-Length it will not wait for) is no error of the test's."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class HostileFarm:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Any] = {}
        self.requests: list[tuple[str, str]] = []
        farm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                farm._answer(self, "GET")

            def do_POST(self) -> None:
                farm._answer(self, "POST")

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def json(self, method: str, path: str, doc: Any, status: int = 200) -> None:
        self.routes[method, path] = (status, doc)

    def blob(self, path: str, data: bytes, **lies: Any) -> None:
        """``lies``: Blob's fields (sha256, length, cut, resume_from)."""
        self.routes["GET", path] = Blob(data, **lies)

    def _answer(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = urlsplit(h.path).path
        self.requests.append((method, path))
        if n := int(h.headers.get("content-length") or 0):
            h.rfile.read(n)
        route = self.routes.get((method, path))
        if isinstance(route, Blob):
            self._blob(h, route)
            return
        status, doc = route or (404, {"error": "NotFound", "detail": f"no {method} {path} here"})
        body = json.dumps(doc).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    @staticmethod
    def _blob(h: BaseHTTPRequestHandler, blob: Blob) -> None:
        blob.answers += 1
        asked = (h.headers.get("range") or "").removeprefix("bytes=").partition("-")[0]
        data, total = blob.data, len(blob.data)
        if asked.isdigit() and blob.cut is not None:
            start = int(asked) if blob.resume_from is None else blob.resume_from
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{total - 1}/{total}")
            data = data[start:]
        else:
            h.send_response(200)
        declared = len(data) if blob.length is None else blob.length
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("X-Content-SHA256", blob.sha256 or hashlib.sha256(blob.data).hexdigest())
        h.send_header("Content-Length", str(declared))
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(data[: blob.cut] if blob.cut is not None and blob.answers == 1 else data)
        h.wfile.flush()
        h.close_connection = True


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under ``root`` (links not followed): a file's sha256, a link's target, or a folder."""
    found: dict[str, tuple[str, str]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            key = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[key] = ("link", os.readlink(path))
            elif path.is_dir():
                found[key] = ("dir", "")
            else:
                found[key] = ("file", sha(path.read_bytes()))
    return found


def outside(before: dict[str, tuple[str, str]], after: dict[str, tuple[str, str]], *allowed: str) -> dict[str, Any]:
    """What changed between two snapshots outside the folders ``allowed`` (relative paths): {} when nothing did."""

    def kept(key: str) -> bool:
        return not any(key == a or key.startswith(a + "/") for a in allowed)

    keys = {k for k in before.keys() | after.keys() if kept(k)}
    return {k: (before.get(k), after.get(k)) for k in sorted(keys) if before.get(k) != after.get(k)}
