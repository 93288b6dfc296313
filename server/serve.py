"""Running the API under uvicorn with a protocol and a listening socket of our own.

- The listening socket has TCP_NODELAY, which every accepted connection inherits in every worker process: with
  ``--workers N`` > 1, uvicorn's keep-alive answers otherwise wait on Nagle's algorithm.
- A request's line and headers get ``ENGINEFARM_HEADER_TIMEOUT_S`` to arrive, counted from the connection's
  opening or the request's first byte (as nginx's ``client_header_timeout``); past it, a 408 and a close. Their
  bytes are bounded as they arrive (``HeadLimitProtocol``, server/headlimits.py).
- A fleet's conditional ``GET /v1/resolve`` whose answer has not changed gets its 304 here, from the farm app's
  ``not_modified`` (``api.http.answers``), as soon as its headers are parsed, where the protocol can answer exactly
  as the app would: HTTP/1.1 kept alive, no body, no ``Origin``, no earlier request still being answered, writes
  not paused; the app's metrics counted and uvicorn's access line logged. Anything else goes to the app."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import httptools
import uvicorn
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.supervisors import Multiprocess

from enginefarm.core.config import KEEP_ALIVE_SECONDS, Settings
from server.headlimits import HeadLimitProtocol, HeadLimits, refusal
from worker.process.malloc import limit_arenas

APP = "api.main:app"
log = logging.getLogger(__name__)
# The protocols here (and server/headlimits.py) use uvicorn's httptools protocol's internals (parser, flow control,
# request cycle, pipeline): only on the releases tested (pyproject.toml pins them; tests/unit/test_uvicorn_contract.py
# checks every name used). On any other release ``serve_api`` serves with uvicorn's h11 protocol and its head bound
# (``h11_max_incomplete_event_size``), without the header deadline or the 304s, and says so.
TESTED_UVICORN = ("0.55",)
_TIMED_OUT = refusal(408, "Request Timeout", "the request's line and headers took too long")
_NOT_MODIFIED = b"HTTP/1.1 304 Not Modified\r\n"
_RESOLVE = b"/v1/resolve"
# A request with any of these is the app's: a body, a CORS answer, an upgrade, a 100-continue.
_APP_ONLY = frozenset({b"content-length", b"transfer-encoding", b"origin", b"upgrade", b"expect"})
NotModified = Callable[[bytes, bytes, bytes], "bytes | None"]


def not_modified_of(app) -> NotModified | None:
    """The farm app's ``not_modified`` (``app.state``), found through the server's wrappers (proxy headers); None
    for another app (bench/floorapp.py) or one that answers every request itself (OpenTelemetry on)."""
    for _ in range(8):
        state = getattr(app, "state", None)
        if state is not None:
            return getattr(state, "not_modified", None)
        app = getattr(app, "app", None)
    return None


async def _nothing(scope, receive, send) -> None:
    return None


def _forwarded_client(proxy: ProxyHeadersMiddleware, scope: dict) -> None:
    """Rewrite the scope's client as the proxy-headers middleware would (it has no await before its app's)."""
    call = ProxyHeadersMiddleware(_nothing, [])
    call.trusted_hosts = proxy.trusted_hosts
    try:
        call(scope, None, None).send(None)  # type: ignore[arg-type]
    except StopIteration:
        pass


class HeaderTimeoutProtocol(HeadLimitProtocol):
    """uvicorn's httptools protocol with a deadline on each request's line and headers (and their bytes bounded,
    ``HeadLimitProtocol``)."""

    def __init__(self, *args, header_timeout: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._header_deadline: asyncio.TimerHandle | None = None
        # armed when a read ends inside a request's headers, not per request (most come whole in one read)
        self._in_headers = False

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

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._bound_the_wait()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._bound_the_wait()

    def _bound_the_wait(self) -> None:
        """Arm the deadline where the connection now waits on the client's headers and no answer is being written
        (one that is, and what is queued behind it, looks again when done): a read that ended inside a request's
        line and headers (the keep-alive timer stopped: this deadline bounds the wait), or one that began no
        request and left no timer running (a bare CRLF between requests stops the keep-alive's)."""
        if (
            self.transport.is_closing()
            or self.refused  # answered 414/431 and closing: no 408 after that
            or self not in self.connections  # upgraded: the connection is another protocol's
            or self.pipeline
            or (self.cycle is not None and not self.cycle.response_complete)
        ):
            return
        if self._in_headers:
            self._unset_keepalive_if_required()
            self._arm()
        elif self.timeout_keep_alive_task is None:
            self._arm()

    def on_message_begin(self) -> None:
        self._in_headers = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing() or self.refused:
            return
        log.info("%s: request headers not complete after %g s, connection closed", self.client, self.header_timeout)
        # A 408 only where no answer to an earlier (pipelined) request is still being written.
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_TIMED_OUT)
        self.transport.close()


class FarmProtocol(HeaderTimeoutProtocol):
    """HeaderTimeoutProtocol that answers a fleet's unchanged conditional resolve with a 304 itself."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.not_modified = not_modified_of(self.app)
        self._answered = False  # the request being parsed was answered here: its body and end are nobody's

    def on_message_begin(self) -> None:
        self._answered = False
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        answer = self._not_modified() if self.not_modified is not None else None
        if answer is not None:
            self._in_headers = False
            self._disarm()
            self._answered = True
            self._send_not_modified(*answer)
            return
        # A request that follows an answer given here in the same read: the keep-alive timer that answer armed
        # must not run while the app answers this one (uvicorn arms it only once no request is left).
        self._unset_keepalive_if_required()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._answered:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._answered:
            self._message_ended()  # the head limits' framing: the next request's head follows
        else:
            super().on_message_complete()

    def _not_modified(self) -> tuple[bytes, bytes, bool] | None:
        """The 304's header lines, the query string and whether X-Forwarded-For came, where this request may be
        answered here and the app's ``not_modified`` says the answer has not changed; None: the app's."""
        parser = self.parser
        if (
            (self.cycle is not None and not self.cycle.response_complete)
            or self.pipeline
            or self.flow.write_paused
            or self.root_path
            or self.limit_concurrency is not None
            or parser.get_method() != b"GET"
            or parser.get_http_version() != "1.1"
            or not parser.should_keep_alive()
        ):
            return None
        url = httptools.parse_url(self.url)
        if url.path != _RESOLVE:
            return None
        authorization = if_none_match = None
        forwarded = False
        for name, value in self.headers:
            if name == b"authorization":
                if authorization is not None:
                    return None
                authorization = value
            elif name == b"if-none-match":
                if if_none_match is not None:
                    return None
                if_none_match = value
            elif name in _APP_ONLY:
                return None
            elif name == b"x-forwarded-for":
                forwarded = True
        if authorization is None or if_none_match is None:
            return None
        query = url.query or b""
        try:
            lines = self.not_modified(query, authorization, if_none_match)
        except Exception:  # the app answers, and says what is wrong; here it would end as a 400 and a close
            log.warning("not_modified failed; the app answers", exc_info=True)
            return None
        return None if lines is None else (lines, query, forwarded)

    def _send_not_modified(self, lines: bytes, query: bytes, forwarded: bool) -> None:
        out = [_NOT_MODIFIED]
        for name, value in self.server_state.default_headers:  # date and server, as uvicorn writes them
            out += [name, b": ", value, b"\r\n"]
        out += [lines, b"\r\n"]
        self.transport.write(b"".join(out))
        if self.access_log and self.access_logger.isEnabledFor(logging.INFO):
            try:
                self._log_access(query, forwarded)
            except Exception:  # the answer is written: a failed log line must not turn it into a 400
                log.debug("access line of a 304 not written", exc_info=True)
        self.on_response_complete()  # counted, keep-alive timer armed, as after the app's answer

    def _log_access(self, query: bytes, forwarded: bool) -> None:
        scope = self.scope
        scope.update({"method": "GET", "path": _RESOLVE.decode(), "raw_path": _RESOLVE, "query_string": query})
        if forwarded and isinstance(self.app, ProxyHeadersMiddleware):
            _forwarded_client(self.app, scope)  # type: ignore[arg-type]
        self.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(scope),
            "GET",
            get_path_with_query_string(scope),
            "1.1",
            304,
        )


def tested_uvicorn(version: str | None = None) -> bool:
    """Whether this uvicorn release (``uvicorn.__version__`` by default) is one the protocols here were tested on."""
    version = version or uvicorn.__version__
    return any(version == tested or version.startswith(tested + ".") for tested in TESTED_UVICORN)


def http_protocol(
    header_timeout_s: float, limits: HeadLimits
) -> tuple[Callable[..., asyncio.Protocol] | str, dict[str, Any]]:
    """uvicorn's ``http`` setting and its other settings: the farm's protocol on a tested uvicorn, else h11 with
    the head bounded by uvicorn's own setting."""
    if tested_uvicorn():
        # A partial of a module-level class: it crosses to the worker processes (pickled) with the config, and
        # each process's connections have the same deadline and head limits.
        return functools.partial(FarmProtocol, header_timeout=header_timeout_s, limits=limits), {}
    log.warning(
        "uvicorn %s is not a release this farm was tested on (%s): serving with uvicorn's h11 protocol and a %d-byte "
        "head bound, without the header deadline or the 304s answered before the app",
        uvicorn.__version__,
        ", ".join(f"{v}.*" for v in TESTED_UVICORN),
        limits.request_line + limits.header_bytes,
    )
    return "h11", {"h11_max_incomplete_event_size": limits.request_line + limits.header_bytes}


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
    # Before the server's threads start; the processes of --workers N are spawned, and glibc reads the variable there.
    if limit_arenas(settings.api_malloc_arenas):
        os.environ.setdefault("MALLOC_ARENA_MAX", str(settings.api_malloc_arenas))
    if header_timeout_s is None:
        header_timeout_s = settings.header_timeout_s
    limits = HeadLimits(settings.max_request_line_bytes, settings.max_header_bytes, settings.max_header_fields)
    protocol, http_settings = http_protocol(header_timeout_s, limits)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        http=protocol,  # type: ignore[arg-type]  # uvicorn calls it for each connection: any protocol factory does
        # The API has no websocket route: an upgrade is answered as a plain request, never handed to a websocket
        # protocol with buffers of its own (uvicorn's "auto" would take one wherever a websocket library is found).
        ws="none",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        **http_settings,
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
