"""The test tiers' guards: what a unit test and an integration test may not touch, enforced while they run.

- ``tests/unit``: no service and no process. No socket is connected or bound, no database is opened (SQLite
  included), nothing is started (a process, a fork). ``make test-fast`` runs this tier alone.
- ``tests/integration``: in this process, on SQLite and a local store. Sockets within the process are allowed (a
  server in a thread), but no PostgreSQL, Redis or other service, and no process.
- ``tests/e2e``: real services and worker processes; unguarded.

A test that asks for a service fixture fails at once with the tier's rule (``check_fixtures``); one that reaches a
service some other way fails where it does, with the same rule (``guard``).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# The session's services (tests/conftest.py) and the fixtures that start or need them.
SERVICE_FIXTURES = frozenset(
    {"base_services", "pg_url", "redis_url", "seaweedfs", "dist_env", "dist_settings", "farm", "api", "auth_headers"}
)
SERVICE_PORTS = frozenset({5432, 6379, 3306, 5672, 1883, 4222})
# ctypes.util.find_library asks these (at import, in some libraries): reading the linker's cache starts no service.
LIBRARY_LOOKUPS = frozenset({"ldconfig", "/sbin/ldconfig", "gcc", "cc", "ld", "objdump"})


class TierViolation(RuntimeError):
    """A test used what its tier may not."""


def _refuse(tier: str, what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise TierViolation(f"a {tier} test may not {what}; put it in {_where(tier)}")

    return refuse


def _where(tier: str) -> str:
    return "tests/integration (in process) or tests/e2e" if tier == "unit" else "tests/e2e"


def check_fixtures(item: pytest.Item, tier: str) -> None:
    asked = SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
    if asked:
        raise TierViolation(
            f"a {tier} test may not use the service fixture(s) {sorted(asked)}; put it in {_where(tier)}"
        )


def guard(tier: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Refuse, for the test that runs, what ``tier`` may not touch (a tier's conftest makes it autouse)."""
    popen = subprocess.Popen.__init__

    def no_process(self: subprocess.Popen, args: Any, *a: Any, **k: Any) -> None:
        first = args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]
        if str(first) in LIBRARY_LOOKUPS or os.path.basename(str(first)) in LIBRARY_LOOKUPS:
            popen(self, args, *a, **k)
            return
        raise TierViolation(f"a {tier} test may not start a process ({first}); put it in {_where(tier)}")

    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    monkeypatch.setattr(os, "fork", _refuse(tier, "fork"))
    monkeypatch.setattr(os, "posix_spawn", _refuse(tier, "start a process"))
    try:
        import psycopg

        monkeypatch.setattr(psycopg.Connection, "connect", _refuse(tier, "connect to PostgreSQL"))
    except ImportError:  # the client's environment has no PostgreSQL driver
        pass
    if tier == "unit":
        monkeypatch.setattr(socket.socket, "connect", _refuse(tier, "connect a socket"))
        monkeypatch.setattr(socket.socket, "connect_ex", _refuse(tier, "connect a socket"))
        monkeypatch.setattr(socket.socket, "bind", _refuse(tier, "bind a socket"))
        monkeypatch.setattr(sqlite3, "connect", _refuse(tier, "open a database"))
    else:
        connect = socket.socket.connect

        def no_service(self: socket.socket, address: Any) -> None:
            if isinstance(address, tuple) and len(address) >= 2 and address[1] in SERVICE_PORTS:
                raise TierViolation(f"an {tier} test may not reach a service (port {address[1]}); put it in tests/e2e")
            connect(self, address)

        monkeypatch.setattr(socket.socket, "connect", no_service)
    yield
