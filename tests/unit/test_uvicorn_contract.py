"""The server's protocols use uvicorn's httptools protocol beyond its public interface (server/serve.py,
server/headlimits.py). This is the contract they were tested on: the installed release is a tested one, the
requirement admits no other, and every method they override and every name they read is there, with the same
parameters. A uvicorn release that changes any of it fails here before it can break the server; and a server
started on an untested release falls back to uvicorn's own h11 protocol with its own head bound."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from pathlib import Path

import tomllib
import uvicorn
from packaging.requirements import Requirement
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from server import serve
from server.headlimits import HeadLimits

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "server" / "serve.py", ROOT / "server" / "headlimits.py"]

# The methods the protocols override, with uvicorn's parameters for each.
OVERRIDDEN = {
    "__init__": ["self", "config", "server_state", "app_state", "_loop"],
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_headers_complete": ["self"],
    "on_body": ["self", "body"],
    "on_message_complete": ["self"],
    "on_response_complete": ["self"],
}
# What they read or call on a connection, its flow control and its request cycle.
CONNECTION = {
    "transport", "flow", "cycle", "parser", "pipeline", "connections", "server_state", "app", "access_log",
    "access_logger", "client", "headers", "limit_concurrency", "loop", "root_path", "scope", "url",
    "timeout_keep_alive_task", "_unset_keepalive_if_required",
}  # fmt: skip
FLOW = {"write_paused", "pause_reading", "resume_reading"}


def test_the_installed_uvicorn_is_a_tested_release():
    assert serve.tested_uvicorn(), f"uvicorn {uvicorn.__version__} is not in TESTED_UVICORN {serve.TESTED_UVICORN}"


def test_the_requirement_admits_only_tested_releases():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [d for group in project["optional-dependencies"].values() for d in group] + project["dependencies"]
    uv = next(Requirement(d) for d in deps if Requirement(d).name == "uvicorn")
    for tested in serve.TESTED_UVICORN:
        assert uv.specifier.contains(f"{tested}.0"), (uv, tested)
    major, minor = map(int, max(serve.TESTED_UVICORN, key=lambda v: tuple(map(int, v.split(".")))).split("."))
    assert not uv.specifier.contains(f"{major}.{minor + 1}.0"), f"{uv} admits an untested release"
    assert not serve.tested_uvicorn(f"{major}.{minor + 1}.0")


def test_every_overridden_method_has_uvicorns_parameters():
    for name, params in OVERRIDDEN.items():
        assert list(inspect.signature(getattr(HttpToolsProtocol, name)).parameters) == params, name


def test_every_name_the_protocols_use_of_a_connection_is_there():
    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(app=lambda *a: None, ws="none")
        config.load()
        conn = HttpToolsProtocol(config, ServerState(), app_state={}, _loop=loop)
    finally:
        loop.close()
    source = inspect.getsource(HttpToolsProtocol)  # what it sets while a request is parsed (url, headers, scope)
    missing = sorted(
        n
        for n in CONNECTION
        if not hasattr(conn, n) and not hasattr(HttpToolsProtocol, n) and not re.search(rf"self\.{n}\s*=", source)
    )
    assert not missing, f"uvicorn's connection no longer has {missing}"
    assert not sorted(
        n for n in FLOW if not hasattr(FlowControl, n) and n not in FlowControl.__init__.__code__.co_names
    )
    assert "response_complete" in inspect.getsource(RequestResponseCycle.__init__)


def test_the_lists_here_cover_what_the_sources_use():
    """A name the protocols start to use of uvicorn's connection must join the contract."""
    text = "".join(p.read_text() for p in SOURCES)
    own = set(re.findall(r"self\.(\w+)\s*(?::[^=\n]*)?=(?!=)", text)) | set(re.findall(r"def (\w+)\(self", text))
    used = set(re.findall(r"self\.(\w+)", text)) - own
    known = CONNECTION | set(OVERRIDDEN) | {"limits", "not_modified"}
    assert used <= known, f"not in the contract: {sorted(used - known)}"


def test_an_untested_release_is_served_by_uvicorns_h11_with_its_head_bound(monkeypatch, caplog):
    monkeypatch.setattr(uvicorn, "__version__", "0.99.0")
    limits = HeadLimits(request_line=8 << 10, header_bytes=64 << 10)
    with caplog.at_level(logging.WARNING, logger=serve.log.name):
        http, extra = serve.http_protocol(30.0, limits)
    assert http == "h11" and extra == {"h11_max_incomplete_event_size": 72 << 10}
    assert "0.99.0 is not a release this farm was tested on" in caplog.text
    config = uvicorn.Config(app=lambda *a: None, http=http, **extra)  # a setting uvicorn has
    assert config.h11_max_incomplete_event_size == 72 << 10
