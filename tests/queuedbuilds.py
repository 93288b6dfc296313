"""A farm whose builds stay queued: a real API process with no worker, where a task changes only when the test
writes it, with the same bulk UPDATE a worker's failure writes. For tests that watch a build change (long polls)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from enginefarm.client import Client
from enginefarm.core.config import Settings
from enginefarm.graph.samples import conv_net, sample_spec
from server.embedded import Farm, embedded_env, issue_token
from storage import catalog
from storage.db import in_transaction

UNSERVED = "tensorrt-rtx/sm120"  # no worker: the task stays queued until the test writes it
SPEC = {**sample_spec(), "benchmark": {"enabled": False}, "accuracy": {"enabled": False}}


@contextmanager
def queue_only_farm(data: Path, name: str, seed: int, database_url: str | None = None) -> Iterator[Farm]:
    """A started API with no worker and one uploaded conv net (``farm.model_id``); ``farm.settings`` reach its
    catalog."""
    env = embedded_env(data) | {"ENGINEFARM_QUEUE_WITHOUT_WORKER": "true", "ENGINEFARM_RECONCILE_SECONDS": "0"}
    if database_url:
        env["ENGINEFARM_DATABASE_URL"] = database_url
    settings = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()})
    farm = Farm(env, log_dir=data, token=issue_token(settings, f"{name}-admin", ["admin"]))
    try:
        farm.start_api()
        with Client(farm.url, token=farm.token) as c:
            farm.model_id = c.upload(conv_net(seed=seed).SerializeToString(), name)[0]["id"]
        farm.settings = settings
        yield farm
    finally:
        farm.stop()


def queued_build(farm: Farm) -> tuple[int, int]:
    """A one-task build that stays queued: (build id, task id)."""
    with Client(farm.url, token=farm.token) as c:
        build = c.build(farm.model_id, [UNSERVED], SPEC, queue_without_worker=True)
    (task,) = build["tasks"]
    assert task["state"] == "queued"
    return build["id"], task["id"]


def fail_later(farm: Farm, task_id: int, after_s: float) -> dict[str, float]:
    """Fail the task ``after_s`` from now, in a thread, as a worker's failure is written; the dict gets the time
    the write committed."""
    done: dict[str, float] = {}

    def run() -> None:
        time.sleep(after_s)
        try:
            in_transaction(catalog.fail_task, task_id, "stopped by the test", settings=farm.settings)
        finally:
            done["at"] = time.monotonic()

    threading.Thread(target=run, daemon=True).start()
    return done
