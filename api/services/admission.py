"""Admission control for builds: whether a submission's new tasks may join the queue.

Checked in the transaction that records them, after ``catalog.hold_admission`` and the inserts, so a refusal rolls
every row back and two submissions at a limit cannot both get in. A dashboard session's builds count as those of
the token that opened it (``Principal.family_id``).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.schemas import ErrorOut
from enginefarm.core.config import Settings
from enginefarm.core.errors import QueueFull, TargetUnavailable
from storage import catalog
from storage.tables import BuildRow

# What the build and sweep routes declare they may answer besides 202 and 422.
RESPONSES: dict[int | str, dict] = {
    409: {"model": ErrorOut, "description": "a target no live worker serves, without queue_without_worker"},
    429: {
        "model": ErrorOut,
        "description": "the token's or the farm's queued build tasks would pass their limit; "
        "retry after Retry-After seconds",
    },
}


def admit(
    settings: Settings,
    session: Session,
    builds: list[BuildRow],
    served: dict[str, set[str]],
    *,
    token_id: int | None,
    queue_without_worker: bool | None,
) -> None:
    """``token_id``: the requesting credential family's (``Principal.family_id``). Raise unless these
    just-recorded builds may stay: every task that will wait for a worker has a live one, unless the request (or,
    when it says nothing, the farm) allows waiting; and neither the token's nor the farm's queue goes past its
    limit. Tasks answered from the catalog neither wait nor count."""
    pending = [t for b in builds for t in b.tasks if t.state in catalog.PENDING_STATES]
    if not pending:
        return
    wait = settings.queue_without_worker if queue_without_worker is None else queue_without_worker
    unserved = sorted({t.target for t in pending} - set(served))
    if unserved and not wait:
        live = ", ".join(sorted(served)) if served else "nothing: no worker is live"
        raise TargetUnavailable(
            f"no live worker serves {', '.join(unserved)}; live workers serve {live}. Choose a target they serve, "
            f'start a worker for it, or send "queue_without_worker": true (CLI: --queue-without-worker) to queue '
            f"the build until one starts",
            unserved=unserved,
            served=sorted(served),
        )
    adding = len(pending)
    if token_id is not None:
        _check(
            catalog.pending_tasks(session, token_id) - adding,
            adding,
            settings.max_queued_tasks_per_token,
            "this token",
            "per token",
            "ENGINEFARM_MAX_QUEUED_TASKS_PER_TOKEN",
        )
    _check(
        catalog.pending_tasks(session) - adding,
        adding,
        settings.max_queued_tasks,
        "the farm",
        "for the farm",
        "ENGINEFARM_MAX_QUEUED_TASKS",
    )


def _check(queued: int, adding: int, limit: int, whose: str, scope: str, setting: str) -> None:
    if queued + adding > limit:
        raise QueueFull(
            f"{whose} has {queued} build tasks queued or waiting now and this request adds {adding}: at most {limit} "
            f"{scope}. Retry once some have run, or ask the farm's operator to raise {setting}",
            limit=limit,
            queued=queued,
            adding=adding,
            setting=setting,
        )
