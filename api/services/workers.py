"""The farm's live workers: those that sent a heartbeat within the TTL, with the targets they build."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.schemas import WorkerOut
from enginefarm.core.config import Settings
from storage import liveness


def live(session: Session, settings: Settings) -> list[WorkerOut]:
    return [WorkerOut.of(r) for r in liveness.live_workers(session, settings.worker_ttl_seconds)]
