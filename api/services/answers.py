"""Resolve answers by ETag: a fleet asking the same question gets the same bytes without the work.

An answer is a function of the request, the asking token's project, and the ids and generations of the model's
versions (``storage.generation`` raises a row's generation with every change to its engines or their benchmarks):
the ETag is a hash of the three, and the body is kept under it. The cache is per API process, bounded by entries
and by the bodies' bytes (least recently used out), and keeps one body per question: a new tag drops the old body.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import Row

from api.schemas.resolve import ResolveRequest


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
        # A known question's tag with the versions' rows it was made of: the same rows (as ``api.services.versions``
        # keeps them, one list until they are read again) make the same tag.
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
