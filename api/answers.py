"""Resolve answers by ETag: a fleet asking the same question gets the same bytes without the work.

An answer is a function of the request (model, version, fingerprint, filters, explain), the asking token's
project, and the catalog's state for the model's versions. That state is summed up by the rows' ids and
generations (``storage.generation`` raises a row's generation with every change to its engines or
their benchmarks), so the ETag is a hash of the three: a client holding it gets a 304 while it is current, and
the API process keeps the body under it and answers again without judging anything.

The cache is per API process and bounded twice, by entries and by the bodies' bytes (least recently used out). A
question keeps one body: a change makes a new tag, and the body under its old tag, which nothing can ask for any
more, is dropped when the new one is kept. So a farm whose versions keep changing holds its live answers, not
their history.

A fleet's GET is answered before FastAPI routes it and parses its thirty-odd query parameters (which costs more
than the rest of a cached answer): a query string that was answered before, from a token in the token cache, needs
only the versions' generations to be answered from the cache or with a 304 (``FleetPath``; the 304 even before
the app is called, by the server's protocol: ``not_modified``), and those are kept
while the catalog's change feed stands still (``api.versions``), so a steady fleet's request reads
nothing. Anything else, and anything that goes wrong on the way, takes the route's full path
(``api.resolver``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import anyio
from fastapi import Response
from sqlalchemy import Row
from starlette.datastructures import Headers

from api.auth import refresh_soon
from api.metrics import REQUEST_SECONDS, RESOLVES, labelled
from api.schemas import ResolveRequest
from storage import resolution
from storage.db import quick_read
from storage.tokens import Principal, hash_token

log = logging.getLogger(__name__)
PATH = "/v1/resolve"
HEADERS = {"Cache-Control": "private, no-cache"}
_CACHE_CONTROL = b"cache-control: private, no-cache\r\n"


def digest_of(req: ResolveRequest) -> bytes:
    """The question, whatever form it came in (GET or POST, parameters in any order)."""
    return hashlib.blake2b(req.model_dump_json().encode(), digest_size=16).digest()


def etag_of(digest: bytes, project: str | None, models: list[Row]) -> str:
    h = hashlib.blake2b(digest, digest_size=16)
    h.update(f"\0{project}\0".encode())
    for m in models:
        h.update(f"{m.id}:{m.generation},".encode())
    return f'"{h.hexdigest()}"'


def matches(if_none_match: str | None, etag: str) -> bool:
    """Whether a request's If-None-Match names this ETag (weak comparison, as RFC 9110 asks for it)."""
    if not if_none_match:
        return False
    if if_none_match == etag:  # a client sends back the one tag it holds
        return True
    if if_none_match.strip() == "*":
        return True
    return any(t.strip().removeprefix("W/") == etag for t in if_none_match.split(","))


Question = tuple[bytes, "str | None"]  # a question's digest (``digest_of``) and the asking project


@dataclass(frozen=True)
class Known:
    """A GET query string answered before: what it asked."""

    model: str
    version: str | None
    digest: bytes


class Answers:
    """Answer bodies by ETag, at most ``entries`` of them and ``max_bytes`` of body in all, one per question, and
    the GET query strings answered before."""

    def __init__(self, entries: int = 4096, max_bytes: int = 16 << 20):
        self.entries = entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._bodies: OrderedDict[str, tuple[bytes, str, Question]] = OrderedDict()
        self._current: dict[Question, str] = {}  # a question's tag whose body is kept
        self._queries: OrderedDict[tuple[bytes, str | None], Known] = OrderedDict()
        # A known question's tag with the versions' rows it was made of: the same rows (as ``api.versions`` keeps
        # them, one list until they are read again) make the same tag.
        self._tags: dict[Question, tuple[list[Row], str]] = {}
        self._lock = threading.Lock()  # routes run in a thread pool

    def __len__(self) -> int:
        return len(self._bodies)

    def known(self, query: bytes, project: str | None) -> Known | None:
        """What a query string answered before asked; kept least recently used out, as the bodies are: a fleet's
        question asked all the time must not fall out behind thousands asked once."""
        key = (query, project)
        with self._lock:
            known = self._queries.get(key)
            if known is not None:
                self._queries.move_to_end(key)
            return known

    def remember(self, query: bytes, project: str | None, known: Known) -> None:
        if self.entries <= 0:
            return
        with self._lock:
            self._queries[(query, project)] = known
            while len(self._queries) > self.entries:
                self._queries.popitem(last=False)

    def tag_of(self, known: Known, project: str | None, models: list[Row]) -> str:
        """``etag_of`` the question and these versions, made once per list of rows; on the event loop."""
        key = (known.digest, project)
        kept = self._tags.get(key)
        if kept is not None and kept[0] is models:
            return kept[1]
        tag = etag_of(known.digest, project, models)
        if len(self._tags) >= 2 * max(self.entries, 1):
            self._tags.clear()
        self._tags[key] = (models, tag)
        return tag

    def get(self, etag: str) -> tuple[bytes, str] | None:
        """The body kept under this tag, and its outcome (the chosen engine's match tier)."""
        with self._lock:
            kept = self._bodies.get(etag)
            if kept is None:
                return None
            self._bodies.move_to_end(etag)
            return kept[0], kept[1]

    def put(self, etag: str, body: bytes, outcome: str, question: Question) -> None:
        """Keep ``body`` under ``etag`` as the answer to ``question`` (its digest and project), dropping the body of
        its previous tag."""
        if self.entries <= 0 or len(body) > self.max_bytes:
            return
        with self._lock:
            old = self._current.get(question)
            if old is not None and old != etag:
                self._drop(old)
            if (kept := self._bodies.pop(etag, None)) is not None:
                self.bytes -= len(kept[0])
            self._bodies[etag] = (body, outcome, question)
            self._current[question] = etag
            self.bytes += len(body)
            while len(self._bodies) > self.entries or self.bytes > self.max_bytes:
                self._drop(next(iter(self._bodies)))

    def _drop(self, etag: str) -> None:
        kept = self._bodies.pop(etag, None)
        if kept is None:
            return
        self.bytes -= len(kept[0])
        if self._current.get(kept[2]) == etag:
            del self._current[kept[2]]


def _versions(settings, known: Known, project: str | None) -> list[Row]:
    with quick_read(settings) as session:
        return resolution.model_versions(session, known.model, known.version, project)


async def versions_of(app, known: Known, project: str | None) -> list[Row]:
    """The versions a known question names: kept (``api.versions``, on the event loop), else read on a thread,
    one read per question at a time: the requests that miss while it runs wait for it, rather than each taking a
    thread and a connection at the moment a change drops what was kept. An entry near the end of its stated time
    is read again in the background while it still answers."""
    versions = app.state.versions
    key = (known.model, known.version, project)
    models = versions.get(key)
    if models is not None:
        if key not in versions.reading and versions.due(key):
            _start_read(app, known, project, key)
        return models
    reading = versions.reading.get(key) or _start_read(app, known, project, key)
    return await asyncio.shield(reading)


_READS: set[asyncio.Task] = set()  # a task nobody holds may be collected before it ends


def _start_read(app, known: Known, project: str | None, key) -> asyncio.Future:
    versions = app.state.versions
    loop = asyncio.get_running_loop()
    reading = versions.reading[key] = loop.create_future()
    reading.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failure no one waited for is not logged

    async def read() -> None:
        try:
            stamp = versions.stamp()
            models = await anyio.to_thread.run_sync(_versions, app.state.settings, known, project)
            versions.put(key, models, stamp)
            reading.set_result(models)
        except BaseException as exc:  # noqa: BLE001 - the waiters take the full path, which says what is wrong
            reading.set_exception(exc if isinstance(exc, Exception) else RuntimeError("read cancelled"))
        finally:
            del versions.reading[key]

    task = loop.create_task(read())
    _READS.add(task)
    task.add_done_callback(_READS.discard)
    return reading


def cached_reader(app, headers: Headers) -> Principal | None:
    """The principal of the request's bearer token where the token cache holds it and it may read; None where only
    the full path can tell (no token, an unknown one, one that may not read)."""
    return reader_of(app, headers.get("authorization"))


def reader_of(app, authorization: str | None) -> Principal | None:
    """``cached_reader`` of an Authorization header's value."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    cache = app.state.token_cache
    key = hash_token(token := token.strip())
    principal = cache.get(key)
    if principal is None or not principal.allows("read"):
        return None
    refresh_soon(cache, app.state.settings, key, token)
    return principal


def not_modified(app, query: bytes, authorization: bytes, if_none_match: bytes) -> bytes | None:
    """A fleet's conditional GET /v1/resolve answered by the server's HTTP protocol before the app is called
    (``server.serve``): the 304's own header lines (ETag, Cache-Control, as ``fleet_answer`` gives
    them), counted as the app counts a 304. Only where nothing would be read: the token cache holds the token
    with ``read``, the query string was answered before, its versions are kept and no read of them is due, and
    If-None-Match names the current tag. None: the app answers, as it would have (it reads what is missing, says
    what is wrong, answers a changed question). Its latency, as the metrics record it, is the time to decide."""
    started = time.perf_counter()
    principal = reader_of(app, authorization.decode("latin-1"))
    if principal is None:
        return None
    known = app.state.answers.known(query, principal.project)
    if known is None:
        return None
    versions = app.state.versions
    key = (known.model, known.version, principal.project)
    models = versions.get(key)
    if models is None or (key not in versions.reading and versions.due(key)):  # the app starts the read
        return None
    tag = app.state.answers.tag_of(known, principal.project, models)
    if not matches(if_none_match.decode("latin-1"), tag):
        return None
    labelled(RESOLVES, "not_modified").inc()
    labelled(REQUEST_SECONDS, "GET", PATH, "304").observe(time.perf_counter() - started)
    return b"etag: " + tag.encode() + b"\r\n" + _CACHE_CONTROL


async def fleet_answer(app, scope, headers: Headers, principal: Principal) -> Response | None:
    """The answer to a GET asked before, from the cache or as a 304; None to take the full path."""
    answers: Answers = app.state.answers
    known = answers.known(scope["query_string"], principal.project)
    if known is None:
        return None
    try:
        models = await versions_of(app, known, principal.project)
    except Exception:  # the full path says what is wrong (a 404, a 503)
        log.debug("fleet path: falling back", exc_info=True)
        return None
    tag = answers.tag_of(known, principal.project, models)
    out = {"ETag": tag, **HEADERS}
    if matches(headers.get("if-none-match"), tag):
        labelled(RESOLVES, "not_modified").inc()
        return Response(status_code=304, headers=out)
    if (kept := answers.get(tag)) is not None:
        labelled(RESOLVES, kept[1]).inc()
        return Response(kept[0], media_type="application/json", headers=out)
    return None
