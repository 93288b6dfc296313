"""A fleet's unchanged conditional resolve gets its 304 from the server's HTTP protocol (``FarmProtocol`` in
``server/serve.py``), as soon as its headers are parsed, with the headers, metrics and access line the
app gives a 304; everything else goes to the app, which answers it as before.

The real app (``create_app``, its start-up run, PostgreSQL) under the real protocol class, fed bytes as a socket
would feed them: a 304 written during ``data_received`` was answered before any task ran, so by the protocol. The
same bytes through uvicorn's protocol without it (``HeaderTimeoutProtocol``) are the app's answer to compare.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
import uvicorn
from prometheus_client import REGISTRY
from uvicorn.server import ServerState

from api.app import create_app
from enginefarm.core.config import Settings
from server import localservers
from server.embedded import issue_token
from server.serve import FarmProtocol, HeaderTimeoutProtocol
from storage.db import session_scope
from tests.helpers import RTX_VERSION, catalog_engine, catalog_model, unique_name

MACHINE = f"cc=8.6&trt_rtx={RTX_VERSION}&platform=x86_64&gpu=NVIDIA+GeForce+RTX+3090"


@pytest.fixture(scope="module")
def catalog(base_services, tmp_path_factory):
    with localservers.scratch_postgres("enginefarm_notmodified") as url:
        data = tmp_path_factory.mktemp("notmodified")
        settings = Settings(data_dir=data, database_url=url, reconcile_seconds=0, gc_interval_seconds=0)
        token = issue_token(settings, "notmodified", ["read"])
        name = unique_name("nm")
        with session_scope(settings) as s:
            model = catalog_model(s, name, uuid.uuid4().hex * 2)
            for arch in ("sm80", "sm86", "cpu"):
                catalog_engine(s, model, arch)
        yield settings, token, name


class AccessLines(logging.Handler):
    """uvicorn's access lines, kept; ``attach`` once the server's Config has set its loggers up."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record) -> None:
        self.lines.append(record.getMessage())

    def attach(self) -> None:
        logging.getLogger("uvicorn.access").addHandler(self)


@pytest.fixture
def access_lines():
    keep = AccessLines()
    yield keep
    logging.getLogger("uvicorn.access").removeHandler(keep)


class Transport(asyncio.Transport):
    """What a protocol writes, kept; a socket's addresses."""

    def __init__(self, peer: str = "127.0.0.1"):
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.peer = peer

    def write(self, data) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": (self.peer, 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The complete HTTP responses in ``data``: status, headers (names lower case), body."""
    out = []
    while b"\r\n\r\n" in data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        size = int(headers.get("content-length", "0"))
        if len(rest) < size:
            break
        out.append((int(status_line.split()[1]), headers, rest[:size]))
        data = rest[size:]
    return out


def get(query: str, token: str | None, *extra: str, version: str = "1.1") -> bytes:
    lines = [f"GET /v1/resolve?{query} HTTP/{version}", "Host: 127.0.0.1:8000"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


class Server:
    """The app started once, and connections to it through either protocol class."""

    def __init__(self, settings: Settings):
        self.app = create_app(settings)
        self.config = uvicorn.Config(self.app, proxy_headers=True, forwarded_allow_ips="127.0.0.1", lifespan="off")
        self.config.load()
        self.state = ServerState()
        # what uvicorn's server keeps there (the date refreshed each second)
        self.state.default_headers = [(b"date", b"Sat, 28 Nov 2026 07:30:00 GMT"), (b"server", b"uvicorn")]

    async def __aenter__(self):
        self.inbox: asyncio.Queue = asyncio.Queue()
        outbox: asyncio.Queue = asyncio.Queue()
        await self.inbox.put({"type": "lifespan.startup"})
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self.lifespan = asyncio.ensure_future(self.app(scope, self.inbox.get, outbox.put))
        assert (await outbox.get())["type"] == "lifespan.startup.complete"
        self.outbox = outbox
        return self

    async def __aexit__(self, *exc):
        await self.inbox.put({"type": "lifespan.shutdown"})
        await self.outbox.get()
        await self.lifespan

    def connect(self, cls=FarmProtocol, peer: str = "127.0.0.1") -> tuple[FarmProtocol, Transport]:
        protocol = cls(
            config=self.config,
            server_state=self.state,
            app_state={},
            _loop=asyncio.get_running_loop(),
            header_timeout=30.0,
        )
        transport = Transport(peer)
        protocol.connection_made(transport)
        return protocol, transport


async def answered(transport: Transport, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """The first ``count`` responses written, once they all are (or what there is after 10 s)."""
    for _ in range(1000):
        if len(got := responses(bytes(transport.out))) >= count:
            return got
        await asyncio.sleep(0.01)
    return responses(bytes(transport.out))


async def ask(server: Server, request: bytes) -> bytes:
    protocol, transport = server.connect()
    protocol.data_received(request)
    await answered(transport, 1)
    return bytes(transport.out)


async def first_answer(server: Server, query: str, token: str) -> str:
    """Ask once without If-None-Match (the app answers: the query string and its versions are kept); its ETag."""
    protocol, transport = server.connect()
    protocol.data_received(get(query, token))
    [(status, headers, _body)] = await answered(transport, 1)
    assert status == 200, headers
    return headers["etag"]


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_an_unchanged_answer_gets_the_apps_304_from_the_protocol(catalog):
    settings, token, name = catalog
    query = f"model={name}&{MACHINE}"

    async def main():
        async with Server(settings) as server:
            tag = await first_answer(server, query, token)
            conditional = get(query, token, f"If-None-Match: {tag}")
            # The app's own 304, through uvicorn's protocol without the shortcut
            protocol, transport = server.connect(HeaderTimeoutProtocol)
            protocol.data_received(conditional)
            assert transport.out == b"", "the app answers on a task of its own, after data_received"
            [apps] = await answered(transport, 1)

            counted = sample("enginefarm_resolve_total", {"outcome": "not_modified"})
            timed = sample(
                "enginefarm_http_request_duration_seconds_count",
                {"method": "GET", "route": "/v1/resolve", "status": "304"},
            )
            protocol, transport = server.connect()
            tasks_before = len(server.state.tasks)
            protocol.data_received(conditional)
            [ours] = responses(bytes(transport.out))  # written during data_received: no task ran
            assert len(server.state.tasks) == tasks_before, "the app was not called"
            assert protocol.timeout_keep_alive_task is not None, "the keep-alive timer runs, as after the app's answer"
            assert protocol._header_deadline is None, "an idle connection is the keep-alive's, not the headers'"
            return apps, ours, counted, timed

    apps, ours, counted, timed = asyncio.run(main())
    assert apps[0] == ours[0] == 304
    assert apps[1].keys() == ours[1].keys() == {"etag", "cache-control", "date", "server"}
    assert apps[1]["etag"] == ours[1]["etag"] and apps[1]["cache-control"] == ours[1]["cache-control"]
    assert ours[2] == b""
    assert sample("enginefarm_resolve_total", {"outcome": "not_modified"}) == counted + 1
    assert (
        sample(
            "enginefarm_http_request_duration_seconds_count",
            {"method": "GET", "route": "/v1/resolve", "status": "304"},
        )
        == timed + 1
    )


@pytest.mark.parametrize(
    "case, want",
    [
        ("another tag", 200),
        ("no token", 401),
        ("an unknown token", 401),
        ("a browser's Origin", 304),
        ("Connection: close", 304),
        ("HTTP/1.0", 304),
        ("a body", 304),
        ("two If-None-Match", 304),
        ("another question", 200),
        ("Expect: 100-continue", 304),
        ("a chunked body", 304),
        ("an Upgrade header", 304),
        ("another project's token", 404),
    ],
)
def test_what_the_protocol_cannot_answer_exactly_goes_to_the_app(catalog, case, want):
    settings, token, name = catalog
    query = f"model={name}&{MACHINE}"
    other_project = issue_token(settings, "elsewhere", ["read"], project="elsewhere")

    async def main():
        async with Server(settings) as server:
            tag = await first_answer(server, query, token)
            asked = {
                "another tag": get(query, token, 'If-None-Match: "0123"'),
                "no token": get(query, None, f"If-None-Match: {tag}"),
                "an unknown token": get(query, "ef_nosuchtoken", f"If-None-Match: {tag}"),
                "a browser's Origin": get(query, token, f"If-None-Match: {tag}", "Origin: https://example.com"),
                "Connection: close": get(query, token, f"If-None-Match: {tag}", "Connection: close"),
                "HTTP/1.0": get(query, token, f"If-None-Match: {tag}", "Connection: keep-alive", version="1.0"),
                "a body": get(query, token, f"If-None-Match: {tag}", "Content-Length: 2") + b"{}",
                "two If-None-Match": get(query, token, f"If-None-Match: {tag}", 'If-None-Match: "0123"'),
                "another question": get(query + "&accept=cpu", token, f"If-None-Match: {tag}"),
                "Expect: 100-continue": get(query, token, f"If-None-Match: {tag}", "Expect: 100-continue"),
                "a chunked body": get(query, token, f"If-None-Match: {tag}", "Transfer-Encoding: chunked")
                + b"0\r\n\r\n",
                "an Upgrade header": get(query, token, f"If-None-Match: {tag}", "Upgrade: h2c"),
                "another project's token": get(query, other_project, f"If-None-Match: {tag}"),
            }[case]
            if case == "another project's token":  # its token cached, and the same query string answered for it
                assert responses(await ask(server, get(query, other_project)))[0][0] == 404
            protocol, transport = server.connect()
            protocol.data_received(asked)
            written_at_once = bytes(transport.out)
            [(status, headers, _)] = await answered(transport, 1)
            return written_at_once, status, transport.closed

    written_at_once, status, closed = asyncio.run(main())
    assert written_at_once == b"", "left to the app"
    assert status == want
    assert closed == (case in ("Connection: close", "HTTP/1.0"))  # as uvicorn closes after the app's answer


def test_pipelined_requests_are_answered_in_order_and_the_apps_one_is_not_cut_off(catalog):
    """Three conditional GETs, a plain one and a conditional one more in one read: the first three are answered at
    once, the plain one by the app and the last after it (queued behind the app's answer, as uvicorn queues); the
    keep-alive timer the 304s armed is not left running while the app answers."""
    settings, token, name = catalog
    query = f"model={name}&{MACHINE}"

    async def main():
        async with Server(settings) as server:
            tag = await first_answer(server, query, token)
            conditional = get(query, token, f"If-None-Match: {tag}")
            protocol, transport = server.connect()
            protocol.data_received(conditional * 3 + get(query, token) + conditional)
            at_once = responses(bytes(transport.out))
            timer_while_app_answers = protocol.timeout_keep_alive_task
            every = await answered(transport, 5)
            return at_once, timer_while_app_answers, every, protocol.timeout_keep_alive_task

    at_once, timer, every, timer_after = asyncio.run(main())
    assert [s for s, *_ in at_once] == [304, 304, 304]
    assert timer is None
    assert [s for s, *_ in every] == [304, 304, 304, 200, 304]
    assert timer_after is not None


def test_a_new_engine_ends_the_304s_at_once(catalog):
    """The catalog's change feed (PostgreSQL's NOTIFY) drops the kept versions: with them kept for up to 5 s, the
    304s end well before."""
    settings, token, name = catalog
    settings = settings.model_copy(update={"resolve_fresh_seconds": 5.0})
    query = f"model={name}&{MACHINE}"

    async def main():
        async with Server(settings) as server:
            tag = await first_answer(server, query, token)
            conditional = get(query, token, f"If-None-Match: {tag}")
            protocol, transport = server.connect()
            protocol.data_received(conditional)
            assert responses(bytes(transport.out))[0][0] == 304
            with session_scope(settings) as s:
                from storage.tables import ModelRow

                catalog_engine(s, s.query(ModelRow).filter_by(name=name).one(), "sm89")
            changed_at = asyncio.get_running_loop().time()
            deadline = changed_at + settings.resolve_fresh_seconds + 2.0
            while asyncio.get_running_loop().time() < deadline:
                protocol, transport = server.connect()
                protocol.data_received(conditional)
                [(status, headers, _)] = await answered(transport, 1)
                if status == 200:
                    return asyncio.get_running_loop().time() - changed_at, headers["etag"]
                await asyncio.sleep(0.05)
            return None, tag

    took, new_tag = asyncio.run(main())
    assert took is not None, "the 304s went on past the stated time"
    assert took <= 1.5, f"{took:.2f} s: the change feed did not end them"
    assert new_tag


def test_the_access_line_names_the_client_as_the_apps_does(catalog, access_lines):
    settings, token, name = catalog
    query = f"model={name}&{MACHINE}"
    lines = access_lines.lines

    async def main():
        async with Server(settings) as server:  # uvicorn's Config sets its loggers up: a handler goes on after
            access_lines.attach()
            tag = await first_answer(server, query, token)
            lines.clear()
            asked = get(query, token, f"If-None-Match: {tag}", "X-Forwarded-For: 203.0.113.7")
            for cls in (HeaderTimeoutProtocol, FarmProtocol):
                protocol, transport = server.connect(cls)
                protocol.data_received(asked)
                assert (await answered(transport, 1))[0][0] == 304

    asyncio.run(main())
    assert len(lines) == 2 and lines[0] == lines[1], lines
    assert lines[0].startswith("203.0.113.7:") and f"GET /v1/resolve?{query} HTTP/1.1" in lines[0] and "304" in lines[0]


def test_a_connection_whose_writes_are_paused_is_the_apps(catalog):
    """A client that does not read its answers: the protocol writes nothing more, the app's answer waits."""
    settings, token, name = catalog
    query = f"model={name}&{MACHINE}"

    async def main():
        async with Server(settings) as server:
            tag = await first_answer(server, query, token)
            protocol, transport = server.connect()
            protocol.pause_writing()
            protocol.data_received(get(query, token, f"If-None-Match: {tag}"))
            written_at_once = bytes(transport.out)
            await asyncio.sleep(0.2)
            protocol.resume_writing()
            return written_at_once, await answered(transport, 1)

    written_at_once, [(status, _, _)] = asyncio.run(main())
    assert written_at_once == b""
    assert status == 304


def test_versions_due_for_a_read_are_left_to_the_app_which_reads_them(catalog, monkeypatch):
    """Versions in the last quarter of their stated time: the app answers and reads them again in the background
    (``api.http.answers.versions_of``); the protocol, which cannot start that read, leaves the request to it."""
    from api.services.versions import Versions

    settings, token, name = catalog
    query = f"model={name}&{MACHINE}"

    async def main():
        async with Server(settings) as server:
            tag = await first_answer(server, query, token)
            monkeypatch.setattr(Versions, "due", lambda self, key: True)
            protocol, transport = server.connect()
            protocol.data_received(get(query, token, f"If-None-Match: {tag}"))
            written_at_once = bytes(transport.out)
            return written_at_once, await answered(transport, 1)

    written_at_once, [(status, _, _)] = asyncio.run(main())
    assert written_at_once == b""
    assert status == 304


def test_an_untrusted_peers_forwarded_for_is_not_believed_in_the_access_line(catalog, access_lines):
    settings, token, name = catalog
    query = f"model={name}&{MACHINE}"
    lines = access_lines.lines

    async def main():
        async with Server(settings) as server:
            access_lines.attach()
            tag = await first_answer(server, query, token)
            lines.clear()
            protocol, transport = server.connect(peer="198.51.100.9")
            protocol.data_received(get(query, token, f"If-None-Match: {tag}", "X-Forwarded-For: 203.0.113.7"))
            assert responses(bytes(transport.out))[0][0] == 304  # answered here

    asyncio.run(main())
    assert len(lines) == 1 and lines[0].startswith("198.51.100.9:"), lines
