"""Uploads into the catalog: a model's bytes and its sample inputs, each stored as a blob with the row that
points at it."""

from __future__ import annotations

from pathlib import Path

from tenacity import retry, retry_if_exception_type, stop_after_attempt

from api.services.bulkwork import run_below
from enginefarm.core.bundle import BundleLimits
from enginefarm.core.config import Settings
from enginefarm.core.domain import ModelInfo
from enginefarm.core.errors import Conflict, Forbidden, ModelRejected
from enginefarm.core.names import upload_problems
from enginefarm.core.worklock import Scratch
from enginefarm.graph.inputs import SamplesInvalid, load_samples
from enginefarm.graph.modelfile import inspect_upload
from storage import catalog
from storage.blobs import get_blob_store, model_key, samples_key
from storage.blobwrite import start_flush, store_with_row
from storage.db import session_scope
from storage.tables import ModelRow


def upload_project(tenant: str | None, asked: str | None) -> str:
    """The project an upload goes to: a project's token puts it in its own (naming another is refused); a
    token of the whole farm puts it where the form's ``project`` says, or in none (''). The name itself is
    checked with the upload's other fields (``ingest_model``)."""
    if tenant is not None:
        if asked not in (None, tenant):
            raise Forbidden(f"this token belongs to project {tenant!r}; it cannot upload to project {asked!r}")
        return tenant
    return asked or ""


# A model uploaded with no version gets the next number under its name; uploads of other bytes under the same
# name at the same moment can pick the same number, and all but one are told to try again. These many times.
AUTO_VERSION_ATTEMPTS = 3


def ingest_model(
    settings: Settings, upload_path: Path, sha256: str, name: str | None, version: str | None, project: str = ""
) -> tuple[ModelRow, bool]:
    """Validate an uploaded file and catalogue it; returns (model, created).

    The same bytes under the same name (and version, if given) are the model already catalogued; if its blob went
    missing, these bytes restore it. Otherwise the file is inspected (a bundle in place: only its model.onnx is
    written to scratch), and the blob and the row are written together (``storage.blobwrite``): a rejected upload
    leaves nothing behind, and identical uploads at once make one row. A local store links the spool file in place.
    """
    if (problems := upload_problems(name, version, project)) or name is None:  # no name is one of the problems
        raise ModelRejected("the upload's form fields are invalid", problems=problems)
    store, key = get_blob_store(settings), model_key(sha256)

    def same_upload(s) -> ModelRow | None:
        existing = catalog.find_model_by_content(s, name, sha256, project)
        return existing if existing is not None and version in (None, existing.version) else None

    with session_scope(settings) as s:
        existing = same_upload(s)
    if existing is not None and store.exists(existing.blob_key):
        return existing, False
    inspected = None
    if existing is None:
        if settings.blob_store == "local":
            start_flush(upload_path)  # the spool becomes the blob: its bytes go to disk while it is inspected
        with Scratch(settings) as scratch:
            inspected = run_below(inspect_upload, upload_path, scratch, BundleLimits.of(settings), unpack_data=False)

    def write(s) -> tuple[ModelRow, bool]:
        nonlocal inspected
        found = same_upload(s)  # again, under the key's lock: an identical upload may have just committed
        if found is not None:
            return found, False  # its blob was stored again (restored, if it was missing) before this ran
        if inspected is None:
            with Scratch(settings) as scratch:
                inspected = inspect_upload(upload_path, scratch, BundleLimits.of(settings), unpack_data=False)
        return catalog.add_model(
            s,
            name=name,
            version=version,
            sha256=sha256,
            fmt=inspected.format,
            size=upload_path.stat().st_size,
            info=inspected.info,
            blob_key=key,
            project=project,
        ), True

    attempts = AUTO_VERSION_ATTEMPTS if version is None else 1
    return retry(retry=retry_if_exception_type(Conflict), stop=stop_after_attempt(attempts), reraise=True)(
        store_with_row
    )(settings, store, key, upload_path, sha256, write)


def attach_samples(
    settings: Settings, model_id: int, upload_path: Path, sha256: str, project: str | None = None
) -> ModelRow:
    """Check an .npz of sample inputs against the model and store it with the model (content-addressed)."""
    with session_scope(settings) as s:
        info = ModelInfo.from_dict(catalog.get_model(s, model_id, project).info)
    try:
        arrays = load_samples(upload_path, info, max_bytes=settings.max_samples_bytes * 4)
    except SamplesInvalid as exc:
        raise ModelRejected("the samples do not fit the model", problems=exc.problems) from None
    described = {
        "count": next((a.shape[0] for a in arrays.values() if a.ndim), 1),
        "arrays": {n: {"shape": list(a.shape), "dtype": str(a.dtype)} for n, a in arrays.items()},
    }
    key = samples_key(sha256)

    def write(s) -> ModelRow:
        model = catalog.get_model(s, model_id)
        catalog.set_samples(s, model, sha256=sha256, key=key, info=described)
        return model

    return store_with_row(settings, get_blob_store(settings), key, upload_path, sha256, write)
