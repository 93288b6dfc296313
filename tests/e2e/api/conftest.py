"""Fixtures of the API tests that run an app in this process on a catalog of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from enginefarm.core.config import Settings
from server import localservers


@pytest.fixture(scope="module")
def own_pg(request, base_services) -> Iterator[str]:
    """A PostgreSQL database of the module's own (named after it): its engines have no bytes, and the suite's farm
    must never list them."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    with localservers.scratch_postgres(f"enginefarm_{name}") as url:
        yield url


@pytest.fixture(params=["postgresql", "sqlite"])
def catalog_settings(request, tmp_path) -> Settings:
    """An in-process app's settings on each kind of catalog, with no reconciler or collector running."""
    url = request.getfixturevalue("own_pg") if request.param == "postgresql" else None
    return Settings(data_dir=tmp_path, database_url=url, reconcile_seconds=0, gc_interval_seconds=0)
