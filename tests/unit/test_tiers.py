"""The unit tier's guard refuses what a unit test may not touch (tests/tiers.py), so the tier stays fast and pure."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
from types import SimpleNamespace

import pytest

from tests.tiers import SERVICE_FIXTURES, TierViolation, check_fixtures


def test_a_unit_test_may_not_start_a_process():
    with pytest.raises(TierViolation, match="may not start a process"):
        subprocess.run(["true"], check=False)


def test_a_unit_test_may_not_open_a_socket_or_a_database():
    with socket.socket() as s, pytest.raises(TierViolation, match="connect a socket"):
        s.connect(("127.0.0.1", 5432))
    with socket.socket() as s, pytest.raises(TierViolation, match="bind a socket"):
        s.bind(("127.0.0.1", 0))
    with pytest.raises(TierViolation, match="open a database"):
        sqlite3.connect(":memory:")


@pytest.mark.parametrize("fixture", sorted(SERVICE_FIXTURES))
def test_asking_for_a_service_fixture_fails_with_where_the_test_belongs(fixture):
    item = SimpleNamespace(fixturenames=["tmp_path", fixture])
    with pytest.raises(TierViolation, match=f"service fixture.*{fixture}.*tests/integration"):
        check_fixtures(item, "unit")
