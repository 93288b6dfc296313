"""CPU seconds of this machine's processes, from /proc: what the bench scripts charge each part of the farm."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    pid: int
    pgrp: int  # process group
    comm: str
    cpu: float  # user + system seconds so far
    reaped: float  # user + system seconds of its children that ended and were waited for


def processes() -> dict[int, Proc]:
    """Every process that can be read, by pid."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        pid = int(entry.name)
        out[pid] = Proc(
            pid,
            int(fields[2]),
            raw[raw.index("(") + 1 : raw.rindex(")")],
            (int(fields[11]) + int(fields[12])) / TICK,
            (int(fields[13]) + int(fields[14])) / TICK,
        )
    return out


def cpu_of(match: Callable[[Proc], bool], reaped: bool = False) -> float:
    """CPU seconds of the processes ``match`` selects; with ``reaped``, their ended children's too (PostgreSQL's
    backends, which the postmaster waits for)."""
    return sum(p.cpu + (p.reaped if reaped else 0.0) for p in processes().values() if match(p))
