"""Farm-wide background jobs run in one process at a time (storage.leader), on both catalogs."""

from __future__ import annotations

from sqlalchemy import text

from enginefarm.core.config import Settings
from storage.db import get_engine
from storage.leader import Leadership


def test_one_holder_at_a_time_and_the_next_takes_over(settings):
    """Two API processes' reconcilers: the first to ask holds the job and keeps it; the other waits its turn."""
    first, second = Leadership(settings, "test-job"), Leadership(settings, "test-job")
    try:
        assert first.held() and first.held()
        assert not second.held()
        assert Leadership(settings, "another-job").held()  # jobs do not block each other
        first.release()
        assert second.held() and not first.held()
    finally:
        first.release()
        second.release()


def test_a_holder_whose_connection_dies_loses_the_job_to_another(pg_url, tmp_path):
    """PostgreSQL ends the lock with its connection (a crashed API host): the next process takes the job over."""
    settings = Settings(data_dir=tmp_path / "farm", database_url=pg_url)
    first, second = Leadership(settings, "test-job-2"), Leadership(settings, "test-job-2")
    try:
        assert first.held() and not second.held()
        pid = first._conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with get_engine(settings).connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        assert not first.held()
        assert second.held()
    finally:
        first.release()
        second.release()
