"""Fixtures of the storage tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from enginefarm.core.config import Settings
from server import localservers
from storage.db import migrate


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request, tmp_path) -> Iterator[Settings]:
    """A migrated catalog of each kind, with a local blob store: SQLite (the embedded farm) and PostgreSQL. The
    PostgreSQL one is a database of its own: rows written here point at a local store, not at the session
    farm's bucket, and must not reach that farm's catalog."""
    if request.param == "sqlite":
        settings = Settings(data_dir=tmp_path / "farm")
        settings.ensure_dirs()
        migrate(settings)
        yield settings
        return
    request.getfixturevalue("base_services")
    with localservers.scratch_postgres("enginefarm_storage") as url:
        settings = Settings(data_dir=tmp_path / "farm", database_url=url)
        settings.ensure_dirs()
        migrate(settings)
        yield settings
