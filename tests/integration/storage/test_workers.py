"""Worker rows in the catalog: each process start is a new worker id, so rows of killed workers are pruned."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from enginefarm.core.config import Settings
from storage import liveness
from storage.db import migrate, session_scope
from storage.tables import WorkerRow


def test_workers_silent_past_the_limit_are_forgotten_and_live_ones_kept(tmp_path):
    settings = Settings(data_dir=tmp_path / "farm")
    migrate(settings)
    with session_scope(settings) as s:
        liveness.heartbeat(s, "w@host/dead0001", "host", ["onnxruntime/cpu-x86_64"], {})
        liveness.heartbeat(s, "w@host/live0002", "host", ["onnxruntime/cpu-x86_64"], {})
    with session_scope(settings) as s:
        s.get(WorkerRow, "w@host/dead0001").last_seen = datetime.now(timezone.utc) - timedelta(hours=2)
    with session_scope(settings) as s:
        assert liveness.prune_workers(s, 3600) == 1
    with session_scope(settings) as s:
        assert [w.id for w in s.query(WorkerRow)] == ["w@host/live0002"]
