"""Why a farm's process failed to start, in its own words: the errors ``enginefarm up`` and ``enginefarm demo`` print
instead of a traceback, and the lines of a child's log that say what went wrong."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

# At most this many lines of a child's log in the error that says why it failed.
EXCERPT_LINES = 20


class FarmError(RuntimeError):
    """Why a farm could not start, in words for its user (``str``); the commands print it without a traceback."""


class CatalogUnreachable(FarmError):
    """The farm's catalog database could not be opened or migrated."""


class StartFailed(FarmError):
    """A process the farm started exited, or never became ready, while the farm was starting: which one, how, and
    the lines of its own log that say why. ``notes``: what else is known (a taken port, what to do)."""

    def __init__(self, process: str, how: str, log: Path | None, excerpt: list[str], notes: list[str] | None = None):
        self.process, self.how, self.log, self.excerpt, self.notes = process, how, log, excerpt, list(notes or [])
        super().__init__(process, how)

    @property
    def message(self) -> str:
        head = f"{self.process} {self.how} while the farm was starting"
        if self.log is None:
            lines = [f"{head} (its output was not kept)"]
        elif self.excerpt:
            lines = [f"{head}; its log, {self.log}, says:", *(f"    {line}" for line in self.excerpt)]
        else:
            lines = [f"{head}; its log, {self.log}, has nothing from this start"]
        return "\n".join([*lines, *self.notes])

    def __str__(self) -> str:
        return self.message


# A traceback's first line, plain or as typer/rich draw it (a box); its frames are indented or inside the box.
_TRACEBACK = re.compile(r"^(?:╭[─ ]*)?Traceback \(most recent call last\)")
_FRAME = re.compile(r"^(?:\s|[│╭╰┃]|$)")
# A new log record: a timestamp ("2026-01-01 10:00:00", Celery's "[2026-01-01 ..."), or a level first (uvicorn).
_RECORD = re.compile(r"^(?:\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b)")
# Lines that report an error outside a traceback: a level, a command's own "error:", an exception, glog's E/F.
_ERROR_LINE = re.compile(
    r"\b(?:ERROR|CRITICAL|FATAL|PANIC)\b|^(?:[Ee]rror|[Ff]atal)\b|^[\w.]*(?:Error|Exception)\b|^[EF]\d{4} \d\d:"
    r"|(?i:address already in use|connection refused)"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def error_lines(text: str, limit: int = EXCERPT_LINES, width: int = 400) -> list[str]:
    """The lines of a process's log that say why it failed: the exception that ended its last traceback (with what
    follows it on further lines) and the error lines after it; without a traceback, the last error lines; without
    those, the log's last lines. At most ``limit`` lines of at most ``width`` characters."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if _TRACEBACK.match(line)]
    picked: list[str] = []
    if starts:
        i = starts[-1] + 1
        while i < len(lines) and _FRAME.match(lines[i]):
            i += 1
        if i < len(lines):
            picked.append(lines[i])
            i += 1
            while i < len(lines) and lines[i].strip() and not _RECORD.match(lines[i]):
                picked.append(lines[i])
                i += 1
        picked = picked[:limit]
        picked += [line for line in lines[i:] if _ERROR_LINE.search(line)][: limit - len(picked)]
    if not picked:
        picked = [line for line in lines if _ERROR_LINE.search(line)][-limit:]
    if not picked:
        picked = [line for line in lines if line.strip()][-limit:]
    return [line if len(line) <= width else line[: width - 3] + "..." for line in picked]


def log_excerpt(path: Path | None, offset: int = 0, limit: int = EXCERPT_LINES) -> list[str]:
    """``error_lines`` of the part of the log file ``path`` from ``offset`` on (what one start of a process wrote; its
    last MiB at most)."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - (1 << 20)))
            return error_lines(f.read().decode(errors="replace"), limit)
    except OSError:
        return []


def exit_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"
