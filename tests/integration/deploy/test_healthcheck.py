"""The image's health check reads the container's command to know its role (the compose test runs it for real in
every role; these pin the parsing and the API check against a real HTTP server)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from server import healthcheck


def cmdline(tmp_path, *args: str):
    path = tmp_path / "cmdline"
    path.write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
    return healthcheck.container_command(path)


def test_the_role_is_the_farm_command_after_the_interpreter_and_entry_point(tmp_path):
    args = cmdline(
        tmp_path,
        "/opt/enginefarm/bin/python",
        "/opt/enginefarm/bin/enginefarm",
        "worker",
        "--name",
        "rtx",
        "--targets",
        "tensorrt-rtx/sm86",
    )
    assert healthcheck.role_of(args) == ("worker", ["--name", "rtx", "--targets", "tensorrt-rtx/sm86"])
    assert healthcheck.option(args, "--name") == "rtx"
    assert healthcheck.option(["api", "--port=9000"], "--port") == "9000"
    assert healthcheck.option(["api"], "--port") is None
    assert healthcheck.role_of(["/bin/sh", "-c", "sleep 1"]) == (None, [])


def test_jobs_and_the_reconciler_are_healthy_while_they_run():
    assert healthcheck.check(["enginefarm", "reconcile", "--loop"]) == "reconcile is running"
    assert healthcheck.check(["/bin/sh", "-c", "enginefarm migrate"]) == "the container command is running"


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b'{"status":"ok"}')

    def log_message(self, *args):
        pass


def test_the_api_check_asks_healthz_on_the_port_the_command_listens_on():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert (
            healthcheck.check(["enginefarm", "api", "--host", "0.0.0.0", "--port", str(port)])
            == f"api on port {port} answers /healthz"
        )
        server.shutdown()
        server.server_close()
        with pytest.raises(OSError):  # nothing listens there any more: unhealthy
            healthcheck.check(["enginefarm", "api", "--port", str(port)])
    finally:
        server.server_close()
