"""Bodies that try to make the API hold memory or disk, or answer 5xx: too many or too large form
fields, unbounded chunked bodies, lying sample headers."""

from __future__ import annotations

from tests.corpus import E, Entry  # noqa: F401

ENTRIES: list[Entry] = []
