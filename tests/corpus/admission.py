"""Requests past the admission limits: too many queued builds, too many uploads at once, builds for
targets no live worker serves."""

from __future__ import annotations

from tests.corpus import E, Entry  # noqa: F401

ENTRIES: list[Entry] = []
