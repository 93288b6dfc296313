"""The blob garbage collector: deletes the blobs no catalog row points at, once they are older than a grace period.

Blobs become garbage when a write stored them but its row never committed: an upload or a build
interrupted between the two (a killed process, a lost database), or samples replaced by others.
The collector runs as ``enginefarm gc`` and in the periodic sweep; both call ``collect_garbage``.

Why it never deletes a referenced blob, although writers store a blob *before* they commit the row
that points at it (``BlobStore.put_for_row``, ``worker.tasks``), and nothing locks the two together:

1. It lists the objects first and reads the referenced keys after. A row that committed before
   the read is seen; a blob stored after the listing is not considered at all.
2. The grace period covers a write whose row commits after the read: its blob was stored at most
   moments before the listing, so it is young and kept. A content-addressed write that finds its
   bytes already stored (perhaps an old orphan) copies nothing but refreshes the object's modified
   time (``BlobStore.put_file``), so a re-used old blob is young again as well.
3. Just before deleting each candidate it checks the catalog again for that one key, in a fresh
   transaction, then looks at the object again: a row that committed during the sweep, or a
   refresh since the listing, keeps the blob.

What is left is a write that refreshes an old orphan in the moment between that last look and the
delete: the row then points at a blob that is gone. The grace period must also exceed any clock
skew between this host and the blob store (S3 stamps LastModified with its own clock).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from enginefarm.config import Settings
from enginefarm.errors import EnginefarmError
from storage.blobs import get_blob_store
from storage.blobs.base import BlobObject, BlobStore
from storage.db import session_scope
from storage.tables import EngineRow, ModelRow

log = logging.getLogger(__name__)

# The namespaces the farm writes blobs under (storage.blobs.base); anything else in a shared bucket is not ours.
MANAGED_PREFIXES = ("models/", "engines/", "samples/")
# Uploads and builds commit their row within seconds of storing the blob; a day also dwarfs any clock skew.
DEFAULT_GRACE_SECONDS = 24 * 3600.0
# Every catalog column that holds a blob key. A new column that points at a blob belongs here, or its
# blobs will be collected (tests/storage/test_gc.py checks that no *_key column is left out).
REFERENCE_COLUMNS = (ModelRow.blob_key, ModelRow.samples_key, EngineRow.blob_key)


class GcRefused(EnginefarmError):
    """The collector will not run: what it sees looks like the wrong catalog for this blob store."""

    status_code = 409


@dataclass
class GcReport:
    """What one sweep saw and did. In a dry run, ``deleted`` and ``partials_deleted`` are what it would delete."""

    dry_run: bool
    grace_seconds: float
    cutoff: datetime  # objects last written after this are young
    scanned: int = 0  # objects listed under the managed prefixes
    referenced: int = 0  # of those, the ones a catalog row points at (including rows committed during the sweep)
    deleted: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    kept_young: list[str] = field(default_factory=list)  # unreferenced, but within the grace period
    vanished: int = 0  # unreferenced and old, but gone before it was deleted (another sweep)
    partials_deleted: list[str] = field(default_factory=list)  # leftovers of interrupted writes
    partials_bytes: int = 0
    missing: list[str] = field(default_factory=list)  # referenced, yet not in the listing: a lost blob
    errors: list[str] = field(default_factory=list)  # "key: why"; the sweep goes on past each

    def to_dict(self) -> dict:
        out = asdict(self)
        out["cutoff"] = self.cutoff.isoformat()
        return out

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (f"gc: scanned {self.scanned}, referenced {self.referenced}, {verb} {len(self.deleted)} "
                f"({self.deleted_bytes} bytes) and {len(self.partials_deleted)} partial upload(s) "
                f"({self.partials_bytes} bytes), kept {len(self.kept_young)} young, {len(self.missing)} missing, "
                f"{len(self.errors)} error(s)")


def referenced_keys(session: Session) -> set[str]:
    """Every blob key some catalog row points at."""
    keys: set[str] = set()
    for column in REFERENCE_COLUMNS:
        keys.update(session.scalars(select(column).where(column.is_not(None)).distinct()))
    return keys


def is_referenced(session: Session, key: str) -> bool:
    return any(session.scalar(select(column).where(column == key).limit(1)) is not None
               for column in REFERENCE_COLUMNS)


def collect_garbage(settings: Settings, *, grace_seconds: float, dry_run: bool = False,
                    now: datetime | None = None, store: BlobStore | None = None,
                    allow_empty_catalog: bool = False) -> GcReport:
    """Delete the blobs no catalog row references and last written more than ``grace_seconds`` before ``now``,
    and the leftovers of writes interrupted as long ago; see the module docstring for why the order matters.

    ``store`` defaults to the one ``settings`` names. Unless ``allow_empty_catalog``, a catalog that references
    nothing while the store holds old blobs raises ``GcRefused`` before anything is deleted: that is what a
    collector pointed at the wrong database sees, and it would delete every blob. Listing or catalog errors
    raise; a failure on one object is recorded in ``errors`` and the sweep goes on.
    """
    if grace_seconds < 0:
        raise ValueError(f"grace_seconds must be >= 0, not {grace_seconds}")
    store = store or get_blob_store(settings)
    now = now or datetime.now(timezone.utc)
    report = GcReport(dry_run=dry_run, grace_seconds=grace_seconds, cutoff=now - timedelta(seconds=grace_seconds))

    # The listing first, the referenced keys after: see the module docstring.
    listed = [obj for prefix in MANAGED_PREFIXES for obj in store.objects(prefix)]
    partials = [p for p in store.partial_uploads() if p.key.startswith(MANAGED_PREFIXES)]
    with session_scope(settings) as s:
        referenced = referenced_keys(s)

    candidates: list[BlobObject] = []
    for obj in listed:
        report.scanned += 1
        if obj.key in referenced:
            report.referenced += 1
        elif obj.modified > report.cutoff:
            report.kept_young.append(obj.key)
        else:
            candidates.append(obj)
    report.missing = sorted(referenced - {obj.key for obj in listed})
    if candidates and not referenced and not allow_empty_catalog:
        raise GcRefused(f"the catalog references no blob, yet the store holds {len(candidates)} old one(s): "
                        f"refusing to delete them (is this the farm's database?)")

    for obj in candidates:
        try:
            _collect(settings, store, obj, report)
        except Exception as exc:  # noqa: BLE001 - one object's trouble must not stop the sweep
            report.errors.append(f"{obj.key}: {exc}")
    for partial in partials:
        if partial.modified > report.cutoff:
            continue  # a write in progress
        try:
            if not dry_run:
                store.discard_partial(partial)
            report.partials_deleted.append(partial.key)
            report.partials_bytes += partial.size
        except Exception as exc:  # noqa: BLE001
            report.errors.append(f"{partial.key}: {exc}")

    if report.deleted or report.partials_deleted or report.errors:
        log.warning(report.summary())
    return report


def _collect(settings: Settings, store: BlobStore, obj: BlobObject, report: GcReport) -> None:
    """Delete one candidate after a last look at the catalog, then at the object, in that order."""
    with session_scope(settings) as s:  # a fresh transaction: it sees rows committed since the listing
        if is_referenced(s, obj.key):
            report.referenced += 1
            return
    current = store.stat(obj.key)
    if current is None:
        report.vanished += 1
        return
    if current.modified > report.cutoff:  # rewritten or re-used since the listing
        report.kept_young.append(obj.key)
        return
    if not report.dry_run:
        store.delete(obj.key)  # a missing object is fine: deleting is idempotent
    report.deleted.append(obj.key)
    report.deleted_bytes += current.size
