"""The blob garbage collector: deletes the blobs no catalog row points at, once they are older than a grace period.

Blobs become garbage when a write stored them but its row never committed: an upload or a build
interrupted between the two (a killed process, a lost database), or samples replaced by others.
The collector runs as ``enginefarm gc`` and in the periodic sweep; both call ``collect_garbage``.

Why it never deletes a referenced blob, although writers store a blob *before* they commit the row
that points at it (``storage.blobwrite``):

1. It lists the objects first and reads the referenced keys after. A row that committed before
   the read is seen; a blob stored after the listing is not considered at all.
2. The grace period covers a write whose row commits after the read: its blob was stored at most
   moments before the listing, so it is young and kept. A content-addressed write that finds its
   bytes already stored (perhaps an old orphan) copies nothing but refreshes the object's modified
   time (``BlobStore.put_file``), so a re-used old blob is young again as well.
3. Its last look at each candidate (the catalog for that one key, then the object) and the delete run
   under the key's lock (``blobwrite.locked_session``), which every writer holds from storing the bytes
   until its row commits. A write in progress makes the collector wait, and then its row keeps the
   blob; a write that starts after the delete stores the bytes again. This holds with no grace period
   at all; the grace period must still exceed any clock skew between this host and the blob store (S3
   stamps LastModified with its own clock), since it is what keeps partial uploads in progress.

The same sweep clears this host's work dir (``Settings.work_dir``; each API and worker host has its own, so a sweep
cleans only the host it runs on): spool files of uploads an API crash cut off (``uploads/upload-*``) and scratch
folders of builds whose process was killed (``build-*``). A process holds a lock on each one it uses
(``enginefarm.core.worklock``), and the kernel drops it when the process dies, so one that is held is never removed.
An unheld one goes once it is also older than the grace period or, sooner, than a live one can be without being
touched: a spool file past ``upload_idle_timeout_s`` (an upload that paused that long was dropped), a scratch
folder past ``build_time_limit_s`` (a build that ran that long was killed). The ages only matter for the moment
between creating one and locking it.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from enginefarm.core import worklock
from enginefarm.core.config import Settings
from enginefarm.core.errors import EnginefarmError
from storage.blobs import get_blob_store
from storage.blobs.base import BlobObject, BlobStore
from storage.blobwrite import is_referenced, locked_session, referenced_keys
from storage.db import session_scope

log = logging.getLogger(__name__)

# The namespaces the farm writes blobs under (storage.blobs.base); anything else in a shared bucket is not ours.
MANAGED_PREFIXES = ("models/", "engines/", "samples/", "references/")
# A spool file or scratch folder exists a moment before its process locks it: one younger than this is never
# taken for a leftover, whatever the grace period (a sweep with none at all runs in the tests).
WORK_MIN_AGE_S = 60.0


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
    stale_uploads: list[str] = field(default_factory=list)  # spool files in this host's work dir, relative to it
    stale_scratch: list[str] = field(default_factory=list)  # scratch folders in this host's work dir
    stale_bytes: int = 0
    errors: list[str] = field(default_factory=list)  # "key: why"; the sweep goes on past each

    def to_dict(self) -> dict:
        out = asdict(self)
        out["cutoff"] = self.cutoff.isoformat()
        return out

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"gc: scanned {self.scanned}, referenced {self.referenced}, {verb} {len(self.deleted)} "
            f"({self.deleted_bytes} bytes) and {len(self.partials_deleted)} partial upload(s) "
            f"({self.partials_bytes} bytes), kept {len(self.kept_young)} young, {len(self.missing)} missing, "
            f"{len(self.errors)} error(s); work dir: {verb} {len(self.stale_uploads)} upload spool file(s) and "
            f"{len(self.stale_scratch)} scratch folder(s) ({self.stale_bytes} bytes)"
        )


def collect_garbage(
    settings: Settings,
    *,
    grace_seconds: float,
    dry_run: bool = False,
    now: datetime | None = None,
    store: BlobStore | None = None,
    allow_empty_catalog: bool = False,
) -> GcReport:
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
    sweep_work_dir(settings, report, now)

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
        raise GcRefused(
            f"the catalog references no blob, yet the store holds {len(candidates)} old one(s): "
            f"refusing to delete them (is this the farm's database?)"
        )

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

    if report.deleted or report.partials_deleted or report.stale_uploads or report.stale_scratch or report.errors:
        log.warning(report.summary())
    return report


def sweep_work_dir(settings: Settings, report: GcReport, now: datetime) -> None:
    """Remove this host's dead spool files and scratch folders (see the module docstring), recording them."""
    work, grace = settings.work_dir, report.grace_seconds
    kinds = (
        (
            sorted((work / worklock.SPOOL_FOLDER).glob(f"{worklock.SPOOL_PREFIX}*")),
            max(WORK_MIN_AGE_S, min(grace, settings.upload_idle_timeout_s)),
            report.stale_uploads,
        ),
        (
            sorted(work.glob(f"{worklock.SCRATCH_PREFIX}*")),
            max(WORK_MIN_AGE_S, min(grace, settings.build_time_limit_s)),
            report.stale_scratch,
        ),
    )
    for paths, dead_after, found in kinds:
        cutoff = now.timestamp() - dead_after
        for path in paths:
            try:
                with worklock.unused(path) as free:
                    # Looked at under the lock: a process that locked it since the listing has it now.
                    if not free or path.lstat().st_mtime > cutoff:
                        continue
                    size = _bytes_under(path)
                    if not report.dry_run:
                        _remove(path)
            except FileNotFoundError:  # its process finished with it meanwhile
                continue
            except OSError as exc:
                report.errors.append(f"{path}: {exc}")
                continue
            found.append(path.relative_to(work).as_posix())
            report.stale_bytes += size


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def _bytes_under(path: Path) -> int:
    if not path.is_dir():
        return path.lstat().st_size
    return sum(os.lstat(os.path.join(root, name)).st_size for root, _, names in os.walk(path) for name in names)


def _collect(settings: Settings, store: BlobStore, obj: BlobObject, report: GcReport) -> None:
    """Delete one candidate after a last look at the catalog, then at the object, under the key's lock: a
    writer of the same bytes holds it from storing them until its row commits (``storage.blobwrite``)."""
    with locked_session(settings, obj.key) as s:  # a fresh transaction: it sees rows committed since the listing
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
