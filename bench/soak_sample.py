"""The soak's sampler: every few seconds, each farm process's RSS, open descriptors and threads (a process and its
children, found by process group), the catalog's connections, the broker's queue depths, and the sizes on disk.

A sample is a flat row: ``{"t": seconds since the start, "series": {name: value}}``. Names are
``KIND|WHO`` where WHO is ``role#pid`` for a process (a restarted process is a new series) and a fixed name for the
farm's shared resources."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.procstat import processes

PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1 << 20


def proc_row(pid: int) -> dict[str, float] | None:
    """RSS (MB), its anonymous part (the heaps) and the rest (mapped files and shared memory), open descriptors and
    threads of one process; None when it is gone."""
    try:
        rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        stat = Path(f"/proc/{pid}/stat").read_text()
        threads = int(stat[stat.rindex(")") + 2 :].split()[17])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        anon_kb = int(status["RssAnon"].split()[0])
    except (OSError, ValueError, IndexError, KeyError):
        return None
    rss = rss_pages * PAGE / MB
    return {
        "rss_mb": rss,
        "rss_anon_mb": anon_kb / 1024,
        "rss_file_mb": rss - anon_kb / 1024,
        "fds": fds,
        "threads": threads,
    }


def fds_on(pid: int, names: set[str]) -> int:
    """Descriptors ``pid`` holds on any of the files ``names``."""
    held = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                held += os.readlink(f"/proc/{pid}/fd/{fd}") in names
            except OSError:
                pass
    except OSError:
        pass
    return held


def du_mb(path: Path) -> float:
    """Bytes under ``path`` (allocated as files say, not blocks), in MB."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total / MB


def sqlite_queue_depths(broker: Path) -> dict[str, int]:
    """Visible messages per queue in the embedded broker (kombu's SQLAlchemy tables), read-only."""
    if not broker.exists():
        return {}
    conn = sqlite3.connect(f"file:{broker}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute(
            "SELECT q.name, count(m.id) FROM kombu_queue q LEFT JOIN kombu_message m "
            "ON m.queue_id = q.id AND m.visible GROUP BY q.name"
        ).fetchall()
    except sqlite3.Error:
        return {}
    finally:
        conn.close()
    return {name: n for name, n in rows}


def redis_queue_depths(client) -> dict[str, int]:
    """LLEN of every list in the soak's Redis database (Celery's queues), priority sub-lists folded in."""
    out: dict[str, int] = {}
    for key in client.scan_iter(count=500):
        if client.type(key) != b"list":
            continue
        name = key.decode().split("\x06\x16")[0]  # kombu's priority lists: NAME\x06\x16N
        out[name] = out.get(name, 0) + client.llen(key)
    return out


class Sampler:
    """Samples ``groups()`` (role -> process-group leader pid) and ``shared()`` (name -> value) every ``every``
    seconds in a thread, until ``stop``."""

    def __init__(
        self,
        every: float,
        groups: Callable[[], dict[str, int]],
        shared: Callable[[], dict[str, float]],
        db_files: set[str] | None = None,
    ):
        self.every, self.groups, self.shared, self.db_files = every, groups, shared, db_files
        self.samples: list[dict] = []
        self.errors: list[str] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def take(self) -> dict:
        series: dict[str, float] = {}
        procs = processes()
        db_total = 0
        for role, leader in self.groups().items():
            members = sorted(p.pid for p in procs.values() if p.pgrp == leader)
            for rank, pid in enumerate(members):
                who = role if pid == leader else f"{role}.child{rank}"
                row = proc_row(pid)
                if row is None:
                    continue
                for kind, value in row.items():
                    series[f"{kind}|{who}#{pid}"] = value
                if self.db_files is not None:
                    held = fds_on(pid, self.db_files)
                    series[f"db_fds|{who}#{pid}"] = held
                    db_total += held
        if self.db_files is not None:
            series["db_connections|farm"] = db_total
        series.update(self.shared())
        return {"t": round(time.monotonic() - self.t0, 2), "series": series}

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.samples.append(self.take())
            except Exception as exc:  # noqa: BLE001 - a failed sample is reported, the soak goes on
                self.errors.append(f"sample at {started - self.t0:.0f} s: {type(exc).__name__}: {exc}")
            self._stop.wait(max(0.0, self.every - (time.monotonic() - started)))
