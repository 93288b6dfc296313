"""Running the API under uvicorn with a listening socket of our own.

With ``--workers N`` > 1, uvicorn's keep-alive answers waited about 42 ms each on Nagle's algorithm (its open
TCP_NODELAY issue): /healthz took 44 ms against 1.4 ms with one worker. TCP_NODELAY set on the listening socket is
inherited by every connection it accepts, in every worker process, and brings it back to about 1.6 ms
(docs/performance.md has the comparison and the command).

uvicorn bounds only the idle time between requests (``timeout_keep_alive``), which it arms once a response is
complete: a new connection, and a request whose headers arrive a byte at a time, are held for ever. So the
protocol here gives a request's line and headers ``ENGINEFARM_HEADER_TIMEOUT_S`` to arrive, counted from the
connection's opening or the request's first byte, as nginx's ``client_header_timeout`` does; past that the client
gets a 408 and the connection is closed. The body has its own bounds (the upload idle timeout)."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.supervisors import Multiprocess

from enginefarm.core.config import KEEP_ALIVE_SECONDS, Settings

APP = "enginefarm.api.main:app"
log = logging.getLogger(__name__)
_TIMED_OUT_BODY = b"the request's line and headers took too long\n"
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_TIMED_OUT_BODY), _TIMED_OUT_BODY)
)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request's line and headers."""

    def __init__(self, *args, header_timeout: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._header_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a connection that never sends a byte is bounded too

    def on_message_begin(self) -> None:
        self._arm()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing():
            return
        log.info("%s: request headers not complete after %g s, connection closed", self.client, self.header_timeout)
        # A 408 only where no answer to an earlier (pipelined) request is still being written.
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_TIMED_OUT)
        self.transport.close()


def listening_socket(config: uvicorn.Config) -> socket.socket:
    sock = config.bind_socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def serve_api(
    host: str,
    port: int,
    workers: int = 1,
    log_level: str = "info",
    header_timeout_s: float | None = None,
    app: str = APP,
) -> None:
    """Serve the API until interrupted: ``workers`` processes sharing one TCP_NODELAY listening socket.
    ``header_timeout_s``: how long a request's headers may take (None: the settings' ``header_timeout_s``).
    Forwarded headers (X-Forwarded-Proto, -For) are trusted only from ``forwarded_allow_ips``. ``app``: the ASGI
    app's import string (another than the farm's only to measure the server itself, bench/floorapp.py)."""
    settings = Settings()
    if header_timeout_s is None:
        header_timeout_s = settings.header_timeout_s
    # A partial of a module-level class: it crosses to the worker processes (pickled) with the config.
    protocol = functools.partial(HeaderTimeoutProtocol, header_timeout=header_timeout_s)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        http=protocol,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )
    sock = listening_socket(config)
    try:
        if workers > 1:
            Multiprocess(config, sockets=[sock]).run()
        else:
            uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
