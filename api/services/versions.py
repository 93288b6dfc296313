"""The model versions a resolve names, with their generations, kept for a stated time.

Every resolve answer, a 304 included, starts from the rows of the versions it names and their generations (what
its ETag is made of). Each API process keeps what it read by (model, version, project), and the fleet's path
(``api.http.fastpath.FleetPath``) trusts it while both hold:

- the catalog's change feed (``storage.changes``) has not moved since the read began (any commit that adds or
  removes a version or raises a generation moves it); a feed that is down trusts nothing;
- at most ``ENGINEFARM_RESOLVE_FRESH_SECONDS`` (0: read every time) have passed.

The full path (``api.services.resolve``) always reads, and refreshes what is kept; errors are never kept. Lookups
run on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict

from sqlalchemy import Row

from storage.changes import Changes

Key = tuple[str, "str | None", "str | None"]


class Versions:
    """Version rows by (model, version, project), at most ``entries`` of them, each trusted for ``seconds``."""

    def __init__(self, seconds: float, entries: int = 4096, changes: Changes | None = None):
        self.seconds = seconds
        self.entries = entries
        self.changes = changes or Changes()
        self._kept: OrderedDict[Key, tuple[list[Row], float, tuple | None]] = OrderedDict()
        self._lock = threading.Lock()  # puts come from route threads
        self.reading: dict[Key, asyncio.Future] = {}  # the fleet's path's reads in flight, on the event loop

    def get(self, key: Key) -> list[Row] | None:
        kept = self._kept.get(key)
        if kept is None:
            return None
        rows, until, changes = kept
        if until <= time.monotonic() or changes != self.changes.current():
            return None
        return rows

    def due(self, key: Key) -> bool:
        """Whether a kept entry is in the last quarter of its stated time: the fleet's path then reads it again in
        the background, so a steady question never waits for that read."""
        kept = self._kept.get(key)
        return kept is not None and kept[1] - time.monotonic() < self.seconds / 4

    def stamp(self) -> tuple[float, tuple | None]:
        """Taken before the read whose rows will be kept: the read is trusted from then on, not from its end."""
        return time.monotonic() + self.seconds, self.changes.current()

    def put(self, key: Key, rows: list[Row], stamp: tuple[float, tuple | None]) -> None:
        if self.seconds <= 0 or self.entries <= 0 or stamp[1] is None:
            return
        with self._lock:
            self._kept[key] = (rows, *stamp)
            self._kept.move_to_end(key)
            while len(self._kept) > self.entries:
                self._kept.popitem(last=False)
            # Entries are in the order they were put, so those past their time lead: drop them, so that a farm
            # whose questions move on keeps rows for the questions of the last ``seconds``, not for all it was asked.
            now = time.monotonic()
            while self._kept and next(iter(self._kept.values()))[1] <= now:
                self._kept.popitem(last=False)
