"""What the routes call: each function does one request's work across catalog, blobs and broker."""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import ValidationError

from enginefarm.config import Settings
from enginefarm.domain import BuildSpec, ModelInfo, TaskState, Target, parse_targets, validate_spec
from enginefarm.errors import ModelRejected, SpecInvalid
from enginefarm.modelfile import inspect_upload
from storage import catalog
from storage.blobs import get_blob_store, model_key
from storage.db import session_scope
from storage.tables import ModelRow
from worker.pipeline import Scratch, bundle_limits

log = logging.getLogger(__name__)

NAME_MAX = 200


def _check_name(name: str | None, version: str | None) -> list[dict]:
    problems = []
    if not name or not name.strip():
        problems.append({"loc": ["name"], "msg": "give the model a 'name'"})
    elif len(name) > NAME_MAX or any(not (c.isalnum() or c in "-_.") for c in name):
        problems.append({"loc": ["name"], "msg": f"name must be 1-{NAME_MAX} letters, digits, '-', '_' or '.'"})
    if version is not None and (not version or len(version) > 100 or any(not (c.isalnum() or c in "-_.+") for c in version)):
        problems.append({"loc": ["version"], "msg": "version must be 1-100 letters, digits, '-', '_', '.' or '+'"})
    return problems


def ingest_model(settings: Settings, upload_path: Path, sha256: str, name: str | None,
                 version: str | None) -> tuple[ModelRow, bool]:
    """Validate an uploaded file and catalogue it; returns (model, created).

    The blob is written before the row and removed again if the row cannot be written, so a
    rejected or failed upload leaves nothing behind.
    """
    problems = _check_name(name, version)
    if problems:
        raise ModelRejected("the upload's form fields are invalid", problems=problems)
    with session_scope(settings) as s:
        existing = catalog.find_model_by_content(s, name, sha256)
        if existing is not None and version in (None, existing.version):
            return existing, False
    with Scratch(settings) as scratch:
        inspected = inspect_upload(upload_path, scratch, bundle_limits(settings))
        info: ModelInfo = inspected.info
    store = get_blob_store(settings)
    key = model_key(sha256)
    was_there = store.exists(key)
    store.put_file(key, upload_path, sha256)
    try:
        with session_scope(settings) as s:
            row = catalog.add_model(s, name=name, version=version, sha256=sha256, fmt=inspected.format,
                                    size=upload_path.stat().st_size, info=info, blob_key=key)
        return row, True
    except BaseException:
        if not was_there:
            store.delete(key)
        raise


def _spec_from(payload: dict) -> tuple[BuildSpec | None, list[dict]]:
    try:
        return BuildSpec(**(payload or {})), []
    except ValidationError as exc:
        return None, [{"loc": ["spec", *err["loc"]], "msg": err["msg"]} for err in exc.errors()]
    except TypeError:
        return None, [{"loc": ["spec"], "msg": "spec must be a JSON object"}]


def submit_build(settings: Settings, model_id: int, target_texts: list[str], spec_payload: dict,
                 publish) -> int:
    """Validate the spec against the model and every target, record the build, queue its tasks;
    returns the build's id.

    Raises SpecInvalid listing every problem at once. Tasks are published only after the
    catalog commit, so a worker never sees a task the catalog does not have.
    """
    targets, problems = parse_targets(target_texts)
    if len(target_texts) > settings.max_targets_per_build:
        problems.append({"loc": ["targets"], "msg": f"at most {settings.max_targets_per_build} targets per build"})
    spec, spec_problems = _spec_from(spec_payload)
    problems += spec_problems
    with session_scope(settings) as s:
        model = catalog.get_model(s, model_id)
        if spec is not None:
            problems += validate_spec(spec, ModelInfo.from_dict(model.info), targets)
        if problems:
            raise SpecInvalid(f"the build request has {len(problems)} problem(s)", problems=problems)
        served = catalog.served_targets(s, settings.worker_ttl_seconds)
        build = catalog.add_build(s, model, spec, targets, served)
        queued = [(t.id, Target.parse(t.target)) for t in build.tasks if t.state == TaskState.QUEUED.value]
    for task_id, target in queued:
        try:
            publish(task_id, target)
        except Exception:  # the row is queued in the catalog; the broker can be retried later
            log.warning("could not publish build task %s to %s", task_id, target.queue, exc_info=True)
    return build.id


def publish_build_task(task_id: int, target: Target) -> None:
    from worker.tasks import build_engine

    build_engine.apply_async(args=[task_id], queue=target.queue)


def wait_reason(target: str, state: str, served: dict[str, set[str]]) -> str | None:
    """Why a queued task is not running yet, when the answer is that nobody can take it."""
    if state == TaskState.QUEUED.value and target not in served:
        return f"waiting: no live worker serves {target}"
    return None
