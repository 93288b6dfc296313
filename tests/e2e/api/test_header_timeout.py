"""Slow request headers: the API (``enginefarm api``, as deployed) gives a request's line and headers
``ENGINEFARM_HEADER_TIMEOUT_S`` to arrive, then answers 408 and closes the connection. Real sockets; a limit of
1 s here (30 s by default)."""

from __future__ import annotations

import select
import socket
import time

import pytest

from server.embedded import Farm, embedded_env

LIMIT_S = 1.0
# Far past the limit: a server without one keeps the connection for as long as the client dribbles.
DRIBBLE_FOR_S = 15.0


@pytest.fixture(scope="module")
def api_port(tmp_path_factory) -> int:
    data = tmp_path_factory.mktemp("header-timeout")
    farm = Farm(
        embedded_env(data) | {"ENGINEFARM_RECONCILE_SECONDS": "0", "ENGINEFARM_HEADER_TIMEOUT_S": str(LIMIT_S)},
        log_dir=data,
    )
    try:
        farm.start_api()
        yield farm.port
    finally:
        farm.stop()


def _answer(conn: socket.socket, wait: float) -> bytes | None:
    """What the server has sent within ``wait`` seconds and until it closed: None if it sent nothing and kept the
    connection open, else the bytes (b"" for a bare close)."""
    if not select.select([conn], [], [], wait)[0]:
        return None
    got = b""
    try:
        while chunk := conn.recv(65536):
            got += chunk
            if not select.select([conn], [], [], 2)[0]:
                break
    except ConnectionResetError:
        pass
    return got


def _dribble(conn: socket.socket, text: bytes, every: float = 0.1) -> tuple[bytes | None, float]:
    """Send ``text`` a byte at a time, then one more header byte every ``every`` s, until the server answers or
    closes; returns (its answer, the seconds it took) or (None, seconds) if it never did."""
    start = time.monotonic()
    for i in range(int(DRIBBLE_FOR_S / every)):
        try:
            conn.sendall(text[i : i + 1] if i < len(text) else b"x")
        except (BrokenPipeError, ConnectionResetError):
            return b"", time.monotonic() - start
        if (got := _answer(conn, every)) is not None:
            return got, time.monotonic() - start
    return None, time.monotonic() - start


def test_headers_sent_a_byte_at_a_time_are_cut_off_with_a_408(api_port):
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        got, took = _dribble(conn, b"GET /healthz HTTP/1.1\r\nHost: farm\r\nX-Slow: ")
    assert got is not None, f"still connected after {took:.0f} s of dribbled headers"
    assert got.startswith(b"HTTP/1.1 408 ") and b"connection: close" in got.lower()
    assert took < LIMIT_S + 5


def test_a_connection_that_sends_nothing_is_closed(api_port):
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        got = _answer(conn, DRIBBLE_FOR_S)
    assert got is not None and got.startswith(b"HTTP/1.1 408 ")


def test_the_next_request_on_a_kept_alive_connection_has_the_same_limit(api_port):
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        # Headers in pieces, within the limit: answered. The limit is on the whole, not on each read.
        for piece in (b"GET /healthz HTTP/1.1\r\n", b"Host: farm\r\n", b"\r\n"):
            conn.sendall(piece)
            time.sleep(LIMIT_S / 5)
        first = _answer(conn, 10)
        assert first is not None and first.startswith(b"HTTP/1.1 200 "), first
        # Idle between requests is the keep-alive's (75 s), not this limit: the connection is still open.
        time.sleep(LIMIT_S * 2)
        got, took = _dribble(conn, b"GET /healthz HTTP/1.1\r\nHost: farm\r\nX-Slow: ")
    assert got is not None and got.startswith(b"HTTP/1.1 408 "), (got, took)


def test_the_start_of_a_request_that_came_with_the_one_before_is_bounded(api_port):
    """One read holds a whole request and the start of the next: the second's headers have the limit too."""
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: farm\r\n\r\nGET /healthz HTTP/1.1\r\nHost: fa")
        start = time.monotonic()
        got = b""
        while time.monotonic() - start < DRIBBLE_FOR_S and b"408" not in got:
            more = _answer(conn, 1.0)
            if more == b"":
                break
            got += more or b""
    assert got.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 408 " in got, got
    assert time.monotonic() - start < LIMIT_S + 5


def test_a_bare_line_break_between_requests_does_not_hold_the_connection(api_port):
    """An empty line between requests is no request (the parser skips it), but the read stopped the keep-alive
    timer: the connection is bounded by this limit instead of held for ever."""
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: farm\r\n\r\n")
        first = _answer(conn, 10)
        assert first is not None and first.startswith(b"HTTP/1.1 200 "), first
        conn.sendall(b"\r\n")
        start = time.monotonic()
        got = _answer(conn, DRIBBLE_FOR_S)
    assert got is not None, f"still open {DRIBBLE_FOR_S:.0f} s after a bare CRLF"
    assert time.monotonic() - start < LIMIT_S + 5
