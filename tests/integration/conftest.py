"""The integration tier's rule, enforced (tests/tiers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tiers import check_fixtures, guard


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    check_fixtures(item, "integration")


@pytest.fixture(autouse=True)
def integration_tier(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from guard("integration", monkeypatch)
