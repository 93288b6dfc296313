"""Values that passed the checks and then misbehaved later: never-expiring tokens, odd offsets, confusable
names, reserved versions, negative dims, duplicate profiles, negative tolerances, booleans read as ids."""

from __future__ import annotations

from tests.corpus import E, Entry  # noqa: F401

ENTRIES: list[Entry] = []
