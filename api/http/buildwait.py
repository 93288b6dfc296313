"""Waiting for a build: ``GET /v1/builds/{id}?wait=S`` with ``If-None-Match`` (a long poll).

A client that holds a build's answer (its ETag) and asks with ``wait`` gets the next answer as soon as it differs
(200, with its ETag), or a 304 once ``wait`` seconds pass with nothing new. Without ``If-None-Match``, or with a
tag that is no longer current, the answer comes at once.

One task per process (``Feed``), running while anyone waits, looks at the catalog's build feed
(``storage.changes.Changes.builds``) every ``LOOK_S`` and wakes the waiters when it moved. Each waiter then reads its
build again, or every ``AGAIN_S`` regardless (a wait reason also changes by time alone), or every ``UNKNOWN_S``
while the feed is unknown.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from fastapi import Query, Request

from api.services.answers import matches
from enginefarm.core.config import Settings
from storage.changes import Changes
from storage.db import session_scope

# Under a proxy's usual read timeout (nginx: 60 s). uvicorn lets a request in flight finish before it stops, so a
# waiter may hold a stopping API process this long (deploy/k8s gives the API 120 s).
WAIT_MAX_S = 30.0
LOOK_S = 0.02
AGAIN_S = 5.0  # a wait reason that changes by time alone (a worker's heartbeat lapsed or began) shows within this
# Waiters' reads at once per process: a burst of them (every waiter wakes at any build's write) never takes all of
# the threads and connections the other routes read with.
_READS = anyio.CapacityLimiter(4)
UNKNOWN_S = 1.0  # how often a waiter reads again while the feed is unknown (PostgreSQL's listener reconnecting)


def wait_query() -> float:
    """A dashboard long poll's ``wait`` (its routes are in no schema, so it needs no description): 0 to
    WAIT_MAX_S, finite."""
    return Query(0, ge=0, le=WAIT_MAX_S, allow_inf_nan=False)


def seen_query() -> str | None:
    """A dashboard long poll's ``seen``: the tag of what the page shows."""
    return Query(None, max_length=100)


def tag_of(body: bytes) -> str:
    return f'"{hashlib.blake2b(body, digest_size=16).hexdigest()}"'


class Feed:
    """Wakes every waiter of this process when the build feed moves; one watching task while anyone waits."""

    def __init__(self, changes: Changes):
        self.changes = changes
        self._moved = asyncio.Event()
        self._waiters = 0
        self._watching: asyncio.Task | None = None

    async def moved(self, seen: tuple | None, timeout: float) -> None:
        """Return when the feed moves from ``seen`` (the waiter's last look), or after ``timeout`` seconds."""
        self._waiters += 1
        if self._watching is None or self._watching.done():
            # from the waiter's look, not the task's first one: a change in between wakes it
            self._watching = asyncio.get_running_loop().create_task(self._watch(seen))
        try:
            await asyncio.wait_for(self._moved.wait(), timeout)
        except asyncio.TimeoutError:  # not the built-in TimeoutError before Python 3.11
            pass
        finally:
            self._waiters -= 1

    async def _watch(self, last: tuple | None) -> None:
        while self._waiters:
            await asyncio.sleep(LOOK_S)
            if (now := self.changes.builds()) != last:
                last = now
                self._moved.set()  # every waiter of this moment wakes; later ones wait on a new event
                self._moved = asyncio.Event()


async def next_answer(
    read: Callable[[], bytes], held: str | None, wait: float, feed: Feed, request: Request
) -> tuple[bytes, str]:
    """The build's answer (``read``: its JSON, read on a thread) and its tag: the first whose tag is not ``held``,
    or the last one read when ``wait`` seconds pass (the caller answers 304 when its tag is still ``held``), or
    when the client hung up."""
    deadline = time.monotonic() + wait
    while True:
        seen = feed.changes.builds()  # before the read: a change during it is read again at once
        body = await anyio.to_thread.run_sync(read, limiter=_READS)
        tag = tag_of(body)
        left = deadline - time.monotonic()
        if not matches(held, tag) or left <= 0:
            return body, tag
        if feed.changes.builds() == seen:
            await feed.moved(seen, min(AGAIN_S if seen is not None else UNKNOWN_S, left))
        if await request.is_disconnected():
            return body, tag


async def next_context(
    request: Request,
    settings: Settings,
    context_of: Callable[[Any], dict],
    answer_of: Callable[[dict], bytes],
    held: str | None,
    wait: float,
) -> dict:
    """A dashboard fragment's long poll (``next_answer``): ``context_of(session)`` read in a session of its own,
    again until ``answer_of(context)`` is no longer tagged ``held`` or ``wait`` passes; the last context read."""
    context: dict = {}

    def read() -> bytes:
        with session_scope(settings) as session:
            context.update(context_of(session))
        return answer_of(context)

    await next_answer(read, held, wait, request.app.state.build_feed, request)
    return context
