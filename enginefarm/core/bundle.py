"""Model bundles: tell a zip or tar bundle from a plain ONNX file, and unpack one safely.

A bundle holds ``model.onnx`` and its external data files. Its bytes are hostile: an archive may try to escape its
folder or expand without bound. Every rejection raises ``ModelRejected`` (``PayloadTooLarge`` for size limits) with
a message the uploader can act on. Nothing here parses ONNX, so the client can unpack a bundle without onnx.

``unpack_bundle`` writes every file (a build reads them). ``unpack_model`` makes the same checks and reads every
entry through (declared sizes, CRCs) but writes only ``model.onnx``; the other files become sparse stand-ins of
their declared sizes, so an inspection sees the bundle's names and sizes without its weights being copied.
"""

from __future__ import annotations

import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from enginefarm.core.errors import ModelRejected, PayloadTooLarge
from enginefarm.core.hashing import CHUNK

if TYPE_CHECKING:
    from enginefarm.core.config import Settings

MODEL_NAME = "model.onnx"
FORMATS = ("onnx", "zip", "tar")

# Small entries compress far better than real weights (zero padding, text): only judge big ones.
_RATIO_MIN_BYTES = 1 << 20
# A zip's entries of 1 MiB or less are not judged one by one, so its whole ratio is judged too (300 entries of 1 MiB of
# zeros: 300 MiB from 0.34 MB), once it expands past this: a small bundle of padding and text is harmless.
_ARCHIVE_RATIO_MIN_BYTES = 16 << 20
_MAX_NAME_COMPONENT = 255
DRIVE = re.compile(r"^[A-Za-z]:")

_ARCHIVE_ERRORS = (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, NotImplementedError)


@dataclass(frozen=True)
class BundleLimits:
    """How much a bundle may hold once unpacked."""

    max_files: int = 10_000
    max_unpacked_bytes: int = 16 << 30
    max_compression_ratio: float = 200.0

    @classmethod
    def of(cls, settings: Settings) -> BundleLimits:
        """The limits the farm's settings give (ENGINEFARM_MAX_BUNDLE_FILES, ...)."""
        return cls(
            max_files=settings.max_bundle_files,
            max_unpacked_bytes=settings.max_unpacked_bytes,
            max_compression_ratio=settings.max_compression_ratio,
        )


# --------------------------------------------------------------------------- format detection


def detect_format(path: Path) -> str:
    """Return ``"zip"``, ``"tar"`` or ``"onnx"``, judged by the file's leading bytes, not its name."""
    with open(path, "rb") as f:
        head = f.read(512)
    # PK\x05\x06 starts an empty zip: calling it a zip gives a clearer message than "not ONNX".
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[257:262] == b"ustar":
        return "tar"
    # Old-style and compressed (gzip, bz2, xz) tars carry no ustar magic in the first block.
    if head and tarfile.is_tarfile(path):
        return "tar"
    return "onnx"


# --------------------------------------------------------------------------- bundle entries


@dataclass
class _Entry:
    """One archive member, reduced to what extraction needs."""

    name: str  # normalized: components joined by "/", no "." or empty parts
    is_dir: bool
    size: int
    member: zipfile.ZipInfo | tarfile.TarInfo  # the member to open


_NATIVE_LIBRARY = re.compile(r"\.(so(\.\d+)*|dll|dylib|pyd)$", re.IGNORECASE)


def _normalize_name(raw: str) -> str:
    """Return the entry's path as clean "/"-joined components, or raise if it could escape."""
    if not raw or "\x00" in raw:
        raise ModelRejected(f"bundle entry {raw!r} has an empty or invalid name")
    if "\\" in raw:
        raise ModelRejected(f"bundle entry {raw!r} contains a backslash; use '/' to separate folders")
    if raw.startswith("/") or DRIVE.match(raw):
        raise ModelRejected(f"bundle entry {raw!r} is an absolute path; entries must be relative")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ModelRejected(f"bundle entry {raw!r} escapes the bundle ('..' is not allowed)")
    if any(len(p.encode()) > _MAX_NAME_COMPONENT for p in parts):
        raise ModelRejected(f"bundle entry {raw!r} has a name component over {_MAX_NAME_COMPONENT} bytes")
    if parts and _NATIVE_LIBRARY.search(parts[-1]):
        # Nothing from an upload is ever loaded as code; a bundle that carries a plugin says it needs it.
        raise ModelRejected(
            f"bundle entry {raw!r} is a native library: plugin and custom-op libraries that come "
            f"with an upload are never loaded; build with the plugins the workers have"
        )
    return "/".join(parts)


def _zip_entries(zf: zipfile.ZipFile) -> Iterator[_Entry]:
    """Yield the zip's members, rejecting encrypted ones and anything but files and folders."""
    for info in zf.infolist():
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
            what = "a symlink" if kind == stat.S_IFLNK else "not a regular file"
            raise ModelRejected(f"bundle entry {info.filename!r} is {what}; bundles hold only files and folders")
        if info.flag_bits & 0x1:
            raise ModelRejected(f"bundle entry {info.filename!r} is encrypted; upload an unencrypted bundle")
        is_dir = info.is_dir() or kind == stat.S_IFDIR
        name = _normalize_name(info.filename)
        if name or not is_dir:  # "./" names the bundle root itself
            yield _Entry(name, is_dir, 0 if is_dir else info.file_size, info)


def _tar_kind(info: tarfile.TarInfo) -> str:
    """Name a non-file tar member's type for an error message."""
    if info.issym():
        return f"a symlink to {info.linkname!r}"
    if info.islnk():
        return f"a hard link to {info.linkname!r}"
    if info.isdev():
        return "a device file or fifo"
    return f"of tar type {info.type!r}"


def _tar_entries(tf: tarfile.TarFile, max_files: int) -> Iterator[_Entry]:
    """Yield the tar's members, rejecting links, devices and fifos; stops after max_files + 1."""
    count = 0
    for info in tf:
        if not (info.isreg() or info.isdir()):
            kind = _tar_kind(info)
            raise ModelRejected(f"bundle entry {info.name!r} is {kind}; bundles hold only files and folders")
        name = _normalize_name(info.name)
        if not name and info.isdir():
            continue  # the "./" entry that `tar -C dir .` writes names the bundle root itself
        yield _Entry(name, info.isdir(), 0 if info.isdir() else info.size, info)
        count += 1
        if count > max_files:
            return  # enough to report the overflow without walking millions of headers


def _check_layout(entries: list[_Entry]) -> None:
    """Reject empty names, duplicates, and a file that is also used as a folder."""
    files: set[str] = set()
    dirs: set[str] = set()
    for e in entries:
        if not e.name:
            raise ModelRejected("bundle has an entry with an empty name")
        parts = e.name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in files:
                raise ModelRejected(f"bundle entry {e.name!r} sits under {parent!r}, which is a file")
            dirs.add(parent)
        if e.is_dir:
            if e.name in files:
                raise ModelRejected(f"bundle entry {e.name!r} is both a file and a folder")
            dirs.add(e.name)
        elif e.name in files:
            raise ModelRejected(f"bundle holds {e.name!r} twice; each name may appear once")
        elif e.name in dirs:
            raise ModelRejected(f"bundle entry {e.name!r} is both a file and a folder")
        else:
            files.add(e.name)


def _check_sizes(entries: list[_Entry], limits: BundleLimits, fmt: str, archive_size: int) -> None:
    """Reject bundles whose declared sizes, counts or compression ratios are over the limits."""
    if len(entries) > limits.max_files:
        # Tar listing stops one past the limit, so its count is a lower bound.
        at_least = "at least " if fmt == "tar" else ""
        raise ModelRejected(
            f"bundle holds {at_least}{len(entries)} files and folders, over the limit of {limits.max_files}"
        )
    total = sum(e.size for e in entries)
    if total > limits.max_unpacked_bytes:
        raise PayloadTooLarge(
            f"bundle expands to {total} bytes, over the limit of {limits.max_unpacked_bytes} "
            f"bytes unpacked (ENGINEFARM_MAX_UNPACKED_BYTES)"
        )
    if fmt == "zip":
        for e in entries:
            assert isinstance(e.member, zipfile.ZipInfo)  # a zip's entries hold its ZipInfo (_zip_entries)
            _check_ratio(f"bundle entry {e.name!r}", e.size, e.member.compress_size, limits.max_compression_ratio)
        _check_ratio("the bundle", total, archive_size, limits.max_compression_ratio, _ARCHIVE_RATIO_MIN_BYTES)
    else:
        # A compressed tar is one stream, so only the whole archive's ratio can be judged.
        _check_ratio("the bundle", total, archive_size, limits.max_compression_ratio)


def _check_ratio(what: str, size: int, packed: int, limit: float, min_bytes: int = _RATIO_MIN_BYTES) -> None:
    """Reject something over ``min_bytes`` that expands more than ``limit`` times its packed size."""
    if size <= min_bytes:
        return
    ratio = size / max(packed, 1)
    if ratio > limit:
        raise PayloadTooLarge(
            f"{what} expands to {size} bytes from {packed}: compression ratio {ratio:.0f} over {limit:g}, the "
            f"limit (ENGINEFARM_MAX_COMPRESSION_RATIO)"
        )


def _strip_single_top_dir(entries: list[_Entry]) -> list[_Entry]:
    """Return entries without their lone top-level folder if it holds model.onnx, else unchanged.

    Zipping or tarring a folder, rather than its contents, puts everything under one folder.
    """
    names = {e.name for e in entries}
    if MODEL_NAME in names:
        return entries
    tops = {e.name.split("/")[0] for e in entries}
    if len(tops) != 1:
        return entries
    top = tops.pop()
    if f"{top}/{MODEL_NAME}" not in names:
        return entries
    kept = []
    for e in entries:
        if e.name != top:
            kept.append(_Entry(e.name[len(top) + 1 :], e.is_dir, e.size, e.member))
    return kept


# --------------------------------------------------------------------------- extraction


def _read_counted(src: BinaryIO, entry: _Entry, room: int, write: Callable[[bytes], object] | None) -> int:
    """Read one member through (its CRC is checked at its end), handing each chunk to ``write`` if given; return
    its byte count. Refuses more than it declared or than ``room``, and fewer than it declared."""
    read = 0
    while chunk := src.read(CHUNK):
        read += len(chunk)
        if read > entry.size:
            raise ModelRejected(f"bundle entry {entry.name!r} holds more than the {entry.size} bytes it declares")
        if read > room:
            raise PayloadTooLarge("bundle expands past the unpacked size limit while extracting")
        if write is not None:
            write(chunk)
    if read != entry.size:
        raise ModelRejected(f"bundle entry {entry.name!r} is truncated: {read} of {entry.size} bytes")
    return read


def _copy_counted(src: BinaryIO, dst_path: Path, entry: _Entry, room: int) -> int:
    """Copy one member to a new file; return its byte count. Refuses more than it declared or than room."""
    # "xb": never overwrite, so no entry can replace another one's file.
    with open(dst_path, "xb") as dst:
        return _read_counted(src, entry, room, dst.write)


def _stand_in(src: BinaryIO, dst_path: Path, entry: _Entry, room: int) -> int:
    """Check one member as ``_copy_counted`` does, but leave a sparse file of its size in its place."""
    read = _read_counted(src, entry, room, None)
    with open(dst_path, "xb") as dst:
        dst.truncate(read)
    return read


def _extract(
    entries: list[_Entry], open_member: Callable[[Any], Any], dest: Path, limits: BundleLimits, only: str | None = None
) -> None:
    """Write every entry under dest with our own loop; bytes are re-counted since headers can lie. With ``only``,
    that file alone is written and every other one becomes a stand-in (``_stand_in``)."""
    used = 0
    for e in entries:
        target = dest.joinpath(*e.name.split("/"))
        if e.is_dir:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        put = _copy_counted if only is None or e.name == only else _stand_in
        with open_member(e.member) as src:
            used += put(src, target, e, limits.max_unpacked_bytes - used)


def _unpack(path: Path, fmt: str, dest: Path, limits: BundleLimits, only: str | None) -> Path:
    """Vet the whole listing before writing a byte, then extract."""
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ValueError(f"{dest} must be empty to unpack a bundle into it")
    if fmt not in ("zip", "tar"):
        raise ValueError(f"unknown bundle format {fmt!r}")
    try:
        with zipfile.ZipFile(path) if fmt == "zip" else tarfile.open(path, mode="r") as archive:
            open_member: Callable[[Any], Any]
            if isinstance(archive, zipfile.ZipFile):
                entries, open_member = list(_zip_entries(archive)), archive.open
            else:
                entries, open_member = list(_tar_entries(archive, limits.max_files)), archive.extractfile
            _check_layout(entries)
            _check_sizes(entries, limits, fmt, path.stat().st_size)
            entries = _strip_single_top_dir(entries)
            if not any(e.name == MODEL_NAME and not e.is_dir for e in entries):
                raise ModelRejected(f"bundle has no {MODEL_NAME} at its top level")
            _extract(entries, open_member, dest, limits, only)
    except _ARCHIVE_ERRORS as exc:
        raise ModelRejected(f"not a readable {fmt} bundle: {exc}") from None
    return dest / MODEL_NAME


def unpack_bundle(path: Path, fmt: str, dest: Path, limits: BundleLimits) -> Path:
    """Check and extract a zip or tar bundle into dest (made if absent, else empty); return its model.onnx."""
    return _unpack(path, fmt, dest, limits, None)


def unpack_model(path: Path, fmt: str, dest: Path, limits: BundleLimits) -> Path:
    """Check a bundle as ``unpack_bundle`` does, every entry's bytes read through, but write only its model.onnx;
    every other file is a sparse stand-in of its size (no bytes written). Return the model.onnx path: it can be
    inspected (names, sizes and layout are the bundle's), not built from."""
    return _unpack(path, fmt, dest, limits, MODEL_NAME)
