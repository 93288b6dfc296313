"""Uploads into the catalog: a model's bytes and its sample inputs, each stored as a blob with the row that
points at it."""

from __future__ import annotations

from pathlib import Path

from enginefarm.config import Settings
from enginefarm.domain import ModelInfo
from enginefarm.errors import Forbidden, ModelRejected, SpecInvalid
from enginefarm.inputs import SamplesInvalid, load_samples
from enginefarm.modelfile import inspect_upload
from enginefarm.validation import check_model_name
from storage import catalog
from storage.blobs import get_blob_store, model_key, samples_key
from storage.db import session_scope
from storage.tables import ModelRow
from storage.tokens import check_project
from worker.pipeline import Scratch, bundle_limits


def upload_project(tenant: str | None, asked: str | None) -> str:
    """The project an upload goes to: a project's token puts it in its own (naming another is refused); a
    token of the whole farm puts it where the form's ``project`` says, or in none ('')."""
    if asked is not None:
        try:
            check_project(asked)
        except SpecInvalid as exc:
            raise ModelRejected("the upload's form fields are invalid",
                                problems=[{"loc": ["project"], "msg": str(exc)}]) from None
    if tenant is not None:
        if asked not in (None, tenant):
            raise Forbidden(f"this token belongs to project {tenant!r}; it cannot upload to project {asked!r}")
        return tenant
    return asked or ""


def ingest_model(settings: Settings, upload_path: Path, sha256: str, name: str | None,
                 version: str | None, project: str = "") -> tuple[ModelRow, bool]:
    """Validate an uploaded file and catalogue it; returns (model, created).

    The blob is written before the row and removed again if the row cannot be written, so a
    rejected or failed upload leaves nothing behind.
    """
    problems = check_model_name(name, version)
    if problems:
        raise ModelRejected("the upload's form fields are invalid", problems=problems)
    with session_scope(settings) as s:
        existing = catalog.find_model_by_content(s, name, sha256, project)
        if existing is not None and version in (None, existing.version):
            store = get_blob_store(settings)
            if not store.exists(existing.blob_key):  # a row whose blob went missing: the same bytes repair it
                store.put_file(existing.blob_key, upload_path, sha256)
            return existing, False
    with Scratch(settings) as scratch:
        inspected = inspect_upload(upload_path, scratch, bundle_limits(settings))
        info: ModelInfo = inspected.info
    key = model_key(sha256)
    with get_blob_store(settings).put_for_row(key, upload_path, sha256), session_scope(settings) as s:
        row = catalog.add_model(s, name=name, version=version, sha256=sha256, fmt=inspected.format,
                                size=upload_path.stat().st_size, info=info, blob_key=key, project=project)
    return row, True




def attach_samples(settings: Settings, model_id: int, upload_path: Path, sha256: str,
                   project: str | None = None) -> ModelRow:
    """Check an .npz of sample inputs against the model and store it with the model (content-addressed)."""
    with session_scope(settings) as s:
        info = ModelInfo.from_dict(catalog.get_model(s, model_id, project).info)
    try:
        arrays = load_samples(upload_path, info, max_bytes=settings.max_samples_bytes * 4)
    except SamplesInvalid as exc:
        raise ModelRejected("the samples do not fit the model", problems=exc.problems) from None
    described = {"count": next((a.shape[0] for a in arrays.values() if a.ndim), 1),
                 "arrays": {n: {"shape": list(a.shape), "dtype": str(a.dtype)} for n, a in arrays.items()}}
    key = samples_key(sha256)
    with get_blob_store(settings).put_for_row(key, upload_path, sha256), session_scope(settings) as s:
        model = catalog.get_model(s, model_id)
        catalog.set_samples(s, model, sha256=sha256, key=key, info=described)
    return model
