"""The names and the writes of every file the client makes. A farm's answer never names a file: a name is made from
known values (a fixed vocabulary, or a field reduced to a strict name of ASCII letters, digits, ``_``, ``-`` and
``.``), and every path is checked to lie in the folder the user named before anything is written there.

A file is written to a temporary name beside it, opened ``O_CREAT | O_EXCL | O_NOFOLLOW`` (so a symbolic link, or
anything else already at that name, is never written through), its size and sha256 checked, and renamed over its
name, which replaces a link sitting there rather than following it. On any failure the temporary file is removed:
nothing partial is left behind."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from enginefarm.core.errors import EnginefarmError, IntegrityError
from enginefarm.core.hashing import HashingWriter

TMP_PREFIX = ".tmp-"
NAME_MAX = 120  # the names made here: well under a file system's 255 bytes, with room for a temporary file's affixes
FILE_NAME_MAX = 250
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafeAnswer(IntegrityError):
    """A farm's answer that would name a file, or reach one, outside what the client makes of known values."""


class UnsafePath(EnginefarmError):
    """A path the client will not write: outside the folder named, or through a symbolic link."""

    status_code = 409


def safe_name(text: Any, fallback: str) -> str:
    """``text`` as a strict file name: ASCII letters, digits, ``_``, ``-`` and ``.`` (anything else becomes ``_``),
    starting with a letter, digit or ``_`` (so never hidden, ``.``, ``..`` or an option), at most ``NAME_MAX``
    characters; ``fallback`` when nothing is left."""
    safe = _UNSAFE.sub("_", str(text if text is not None else ""))[:NAME_MAX].lstrip(".-")
    return safe or fallback


def check_name(name: str) -> str:
    """``name`` if it is one plain file name of ASCII letters, digits, ``_``, ``-`` and ``.``, not starting with ``.``
    (so never hidden, ``.`` or ``..``); raise UnsafePath otherwise."""
    if not isinstance(name, str) or len(name) > FILE_NAME_MAX or not _NAME.fullmatch(name):
        raise UnsafePath(
            f"not writing {name!r}: a file name here is ASCII letters, digits, '_', '-' and '.', not starting with '.'"
        )
    return name


def record_id(value: Any, what: str) -> int:
    """A catalog id from a farm's answer, which goes into a URL and may go into a name: a non-negative integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnsafeAnswer(f"the farm's answer gives {what} the id {value!r}, which is not a catalog id")
    return value


def inside(folder: Path | str, path: Path | str) -> Path:
    """``path`` if it names an entry of ``folder`` or of a folder below it, its parent resolved through every link;
    raise UnsafePath otherwise. The last component is not resolved: a write renames over it, never through it."""
    path = Path(path)
    root = Path(os.path.realpath(folder))
    parent = Path(os.path.realpath(path.parent))
    if path.name in ("", ".", "..") or not (parent == root or parent.is_relative_to(root)):
        raise UnsafePath(f"not writing {path}: it is not inside {folder}")
    return path


def in_folder(folder: Path | str, name: str) -> Path:
    """The path of the strict file name ``name`` in ``folder``, checked to lie there."""
    return inside(folder, Path(folder) / check_name(name))


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable, where the platform lets a directory be fsynced."""
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def open_new(path: Path) -> int:
    """A descriptor on a new file at ``path``: refused when anything (a symbolic link included) is already there.
    The mode goes through the umask, unlike mkstemp's 0600."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)


@contextmanager
def atomic_write(
    final: Path,
    expected: str | None,
    prefix: str = TMP_PREFIX,
    *,
    size: int | None = None,
    verify: Callable[[Path], None] | None = None,
) -> Iterator[HashingWriter]:
    """Yield a hashing writer on a new temporary file beside ``final``; on a clean exit check its sha256 (when
    ``expected``), its size (when ``size``) and ``verify(temporary path)``, then rename it to ``final``. On any
    error nothing is left under ``final`` or beside it."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{prefix[:NAME_MAX]}{secrets.token_hex(8)}"
    fd = open_new(tmp)
    try:
        with os.fdopen(fd, "wb") as fh:
            out = HashingWriter(fh)
            yield out
            fh.flush()
            os.fsync(fh.fileno())
        if size is not None and out.size != size:
            raise IntegrityError(f"{final.name}: wrote {out.size} bytes, expected {size}", sha256=expected)
        if expected is not None and (got := out.hexdigest()) != expected:
            raise IntegrityError(f"{final.name}: wrote sha256 {got}, expected {expected}", sha256=expected)
        if verify is not None:
            verify(tmp)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path | str, text: str, append: bool = False) -> None:
    """Write ``text`` whole at ``path``: replaced through a temporary file, or appended (a CI's job summary file
    collects every step's) to a file that is no symbolic link."""
    path = Path(path)
    data = text.encode("utf-8")
    if not append:
        with atomic_write(path, None, prefix=f".{path.name}{TMP_PREFIX}") as out:
            out.write(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
    except OSError as exc:
        if path.is_symlink():
            raise UnsafePath(f"not appending to {path}: it is a symbolic link") from None
        raise exc
    with os.fdopen(fd, "ab") as fh:
        fh.write(data)
