"""The Celery build task: claim → (reuse or build) → store → catalogue. Holds no TensorRT logic."""

from __future__ import annotations

import logging
import os
import socket
from functools import lru_cache

from enginefarm.config import get_settings
from enginefarm.domain import BuildSpec, Target
from enginefarm.errors import BuildFailed, EnginefarmError, InfrastructureError, TargetUnavailable
from storage import catalog
from storage.blobs import get_blob_store
from storage.db import session_scope
from worker.backends import BuildLog, get_backend
from worker.celery_app import BUILD_TASK, app
from worker.pipeline import Scratch, engine_from_model, model_file_from_store, store_engine
from worker.probe import MachineProbe, probe_machine

log = logging.getLogger(__name__)
MAX_INFRA_RETRIES = 5


def worker_id() -> str:
    return os.environ.get("ENGINEFARM_WORKER_ID") or f"{socket.gethostname()}:{os.getpid()}"


@lru_cache
def local_machine() -> MachineProbe:
    return probe_machine()


@lru_cache
def blob_store():
    """One blob store (one boto3 client) per worker process, not one per task."""
    return get_blob_store(get_settings())


@app.task(name=BUILD_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=MAX_INFRA_RETRIES)
def build_engine(self, task_id: int) -> None:
    me = worker_id()
    with session_scope() as s:
        if not catalog.claim_task(s, task_id, me):
            log.info("task %s is not queued any more (taken or finished); skipping", task_id)
            return
    try:
        _run(task_id, me)
    except InfrastructureError as exc:
        with session_scope() as s:
            catalog.requeue_task(s, task_id, f"retrying after an infrastructure error: {exc.message}")
        raise self.retry(exc=exc, countdown=min(60, 2 ** self.request.retries))
    except (BuildFailed, TargetUnavailable) as exc:
        with session_scope() as s:
            catalog.fail_task(s, task_id, exc.message, getattr(exc, "log_tail", None))
    except Exception as exc:  # an unexpected error must still end the task with its reason
        log.exception("build task %s crashed", task_id)
        with session_scope() as s:
            catalog.fail_task(s, task_id, f"internal error in the worker: {type(exc).__name__}: {exc}")


def _run(task_id: int, me: str) -> None:
    settings = get_settings()
    store = blob_store()
    with session_scope() as s:
        task = catalog.get_task(s, task_id)
        build, model = task.build, task.build.model
        target, spec = Target.parse(task.target), BuildSpec(**build.spec)
        spec_hash, model_fields = build.spec_hash, (model.blob_key, model.sha256, model.format)
        backend_version = get_backend(target.backend).version()
        existing = catalog.find_engine(s, model.sha256, spec_hash, str(target), backend_version)
        if existing is not None:  # identical work never runs twice
            catalog.finish_task_reused(s, task, existing)
            return
    log_buf = BuildLog(limit=settings.log_tail_lines)
    model_path = model_file_from_store(store, *model_fields, settings)
    with Scratch(settings) as scratch:
        try:
            built = engine_from_model(model_path, spec, target, local_machine(), scratch, log_buf)
        except EnginefarmError as exc:
            exc.log_tail = log_buf.tail()
            raise
        key = store_engine(store, built)  # the blob is complete and verified before any row points at it
        with session_scope() as s:
            task = catalog.get_task(s, task_id)
            catalog.record_engine(s, task, task.build.model, built.descriptor, spec_hash=spec_hash, blob_key=key,
                                  build_seconds=built.seconds, worker_id=me, log_tail=log_buf.tail())
