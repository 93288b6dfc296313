"""Streaming multipart uploads: the file goes to disk chunk by chunk, hashed on the way.

Every limit is checked while the bytes arrive (FastAPI's ``UploadFile`` spools the whole body first, unbounded),
the body as a whole included, whatever its framing. The event loop only takes the body's chunks off the
connection; parsing, hashing and writing run in a thread of the upload's own, at a lower priority
(``bulkwork.pump``).
"""

from __future__ import annotations

import io
import os
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import anyio
from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from api.metrics import UPLOAD_BYTES
from api.schemas import ModelOut
from api.services import ingest
from api.services.bulkwork import pump
from enginefarm.core import worklock
from enginefarm.core.config import Settings
from enginefarm.core.errors import ModelRejected, PayloadTooLarge, TooManyUploads, UploadTimedOut
from enginefarm.core.hashing import HashingWriter
from storage.tables import ModelRow
from storage.tokens import Principal

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

T = TypeVar("T")
MAX_FIELD_BYTES = 64 << 10
# A part's headers, bounded by the parser: this many lines of at most this many bytes each.
PART_HEADERS, PART_HEADER_LINE_BYTES = 8, 4096
MAX_PART_HEADER_BYTES = PART_HEADERS * (PART_HEADER_LINE_BYTES + 2)
PART_FRAMING_BYTES = 128  # a boundary line (at most 70 characters by RFC 2046) and its line breaks
# The most of the file's bytes joined, hashed and written at once: a batch of chunks (up to bulkwork.BATCH_BYTES,
# 4 MiB) joined and written whole is slower than the same bytes a MiB at a time.
WRITE_BYTES = 1 << 20


def multipart_body(required: list[str], **properties: dict) -> dict:
    """An upload route's request body for its OpenAPI document: a multipart form with these fields."""
    schema = {"type": "object", "required": required, "properties": properties}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


@dataclass(frozen=True)
class UploadLimits:
    """What one upload may send: its file, its other form fields (how many, their bytes together), and how long it
    may pause. ``file_setting`` names the setting behind ``file_bytes`` for the messages."""

    file_bytes: int
    file_setting: str
    form_fields: int
    form_bytes: int
    idle_timeout_s: float

    @classmethod
    def of(cls, settings: Settings, file_bytes: int, file_setting: str) -> UploadLimits:
        return cls(
            file_bytes, file_setting, settings.max_form_fields, settings.max_form_bytes, settings.upload_idle_timeout_s
        )

    @property
    def body_bytes(self) -> int:
        """The most a valid body can hold: the file, the fields, and each part's boundary and headers."""
        parts = self.form_fields + 1
        return self.file_bytes + self.form_bytes + parts * (MAX_PART_HEADER_BYTES + PART_FRAMING_BYTES)

    def body_too_large(self, size: str) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"the request body is over the {self.body_bytes} bytes an upload may take ({size}): a file of up to "
            f"{self.file_bytes} bytes ({self.file_setting}) and form fields of up to {self.form_bytes} bytes "
            "(ENGINEFARM_MAX_FORM_BYTES); send a smaller file and only the form's own fields"
        )


class UploadSlots:
    """The uploads each token has in flight in this API process, from its first byte until its route returns.

    Counted per process (under ``--workers N`` a token may have N times the limit in flight on the host). The check
    and the increment run on the event loop with no await between them, so two uploads cannot take one last slot.
    """

    def __init__(self) -> None:
        self._in_flight: Counter = Counter()

    @asynccontextmanager
    async def hold(self, principal: Principal, limit: int) -> AsyncIterator[None]:
        # A dashboard session's uploads count with those of the token that opened it.
        key = principal.family_id if principal.family_id is not None else principal.name
        if self._in_flight[key] >= limit:
            raise TooManyUploads(
                f"token '{principal.name}' already has {limit} uploads in flight (its dashboard "
                "sessions' included), the most one token may have (ENGINEFARM_MAX_UPLOADS_PER_TOKEN); "
                "retry once one of them has finished"
            )
        self._in_flight[key] += 1
        try:
            yield
        finally:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]


@dataclass
class ReceivedUpload:
    """An upload spooled to ``path``. Its spool file stays locked (``enginefarm.core.worklock``) until ``discard``,
    so the garbage collector never takes it for the leftover of a crashed API."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    path: Path | None = None
    size: int = 0
    sha256: str = ""
    lock: int | None = None

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        worklock.release(self.lock)
        self.lock = None


class _Receiver:
    """Callbacks for python-multipart's streaming parser: fields to memory (small, few), the file to disk."""

    def __init__(self, spool_dir: Path, limits: UploadLimits, file_field: str):
        self.spool_dir, self.limits, self.file_field = spool_dir, limits, file_field
        self.result = ReceivedUpload()
        self._headers: dict[bytes, bytes] = {}
        self._header_name = b""
        self._header_value = b""
        self._parts = 0
        self._form_bytes = 0
        self._name: str | None = None
        self._buf = bytearray()
        self._fh: io.BufferedWriter | None = None
        self._out: HashingWriter | None = None
        self._pending: list[memoryview] = []  # the file's bytes from the batch being parsed (``flush``)

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_header_field": self._header_field,
            "on_header_value": self._header_val,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_done,
        }

    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > self.limits.form_fields + 1:
            raise PayloadTooLarge(
                f"the form has more than {self.limits.form_fields} fields besides the file "
                "(ENGINEFARM_MAX_FORM_FIELDS); send only the file and the form's own fields"
            )
        self._headers, self._name, self._buf = {}, None, bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_val(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header_name.lower()] = self._header_value
        self._header_name, self._header_value = b"", b""

    def _headers_done(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = params.get(b"name", b"").decode("utf-8", "replace")
        if self._name == self.file_field:
            if self.result.path is not None:
                raise ModelRejected(f"send one '{self.file_field}' part, not several")
            self.result.filename = params.get(b"filename", b"").decode("utf-8", "replace") or None
            fd, tmp = tempfile.mkstemp(dir=self.spool_dir, prefix=worklock.SPOOL_PREFIX)
            self._fh = os.fdopen(fd, "wb")
            self._out = HashingWriter(self._fh)
            self.result.path = Path(tmp)
            self.result.lock = worklock.hold(self.result.path)

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = memoryview(data)[start:end]  # no copy: the file part is most of the body
        if self._fh is not None:
            self.result.size += len(chunk)
            if self.result.size > self.limits.file_bytes:
                raise PayloadTooLarge(
                    f"upload is larger than the limit of {self.limits.file_bytes} bytes "
                    f"({self.limits.file_setting}); send a smaller file"
                )
            self._pending.append(chunk)
        else:
            self._buf += chunk
            if len(self._buf) > MAX_FIELD_BYTES:
                raise ModelRejected(f"form field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes")
            self._form_bytes += len(chunk)
            if self._form_bytes > self.limits.form_bytes:
                raise PayloadTooLarge(
                    f"the form fields besides the file are over {self.limits.form_bytes} bytes "
                    "together (ENGINEFARM_MAX_FORM_BYTES); send only the form's own fields"
                )

    def flush(self) -> None:
        """Hash and write the file's bytes parsed since the last flush, joined into pieces of about WRITE_BYTES."""
        piece: list[memoryview] = []
        size = 0
        for chunk in self._pending:
            if len(chunk) >= WRITE_BYTES:  # a MiB on its own: written as it is, never copied into a piece
                if piece:
                    self._write(piece)
                    piece, size = [], 0
                assert self._out is not None  # the file's bytes are pending only once its part opened the writer
                self._out.write(chunk)
                continue
            piece.append(chunk)
            size += len(chunk)
            if size >= WRITE_BYTES:
                self._write(piece)
                piece, size = [], 0
        if piece:
            self._write(piece)
        self._pending = []

    def _write(self, piece: list[memoryview]) -> None:
        assert self._out is not None  # the file's bytes are pending only once its part opened the writer
        self._out.write(piece[0] if len(piece) == 1 else b"".join(piece))

    def _part_end(self) -> None:
        if self._fh is not None:
            self.flush()
            fh, self._fh = self._fh, None
            fh.close()
            assert self._out is not None  # opened with the file, in _headers_done
            self.result.sha256 = self._out.hexdigest()
        elif self._name:
            self.result.fields[self._name] = self._buf.decode("utf-8", "replace")

    @property
    def in_file_part(self) -> bool:
        """The file part has begun and not ended (its closing boundary has not arrived)."""
        return self._fh is not None

    def abandon(self) -> None:
        """Close and remove the spool file, whatever state the write is in."""
        fh, self._fh = self._fh, None
        try:
            if fh is not None:
                fh.close()  # flushes: on a full disk this fails again, and the file still goes
        except OSError:
            pass
        finally:
            self.result.discard()


async def _chunks(request: Request, limits: UploadLimits) -> AsyncIterator[bytes]:
    """The body's chunks; an UploadTimedOut when the client sends nothing for the idle timeout."""
    stream = request.stream()
    while True:
        with anyio.move_on_after(limits.idle_timeout_s) as waited:
            chunk = await anext(stream, None)
        if waited.cancelled_caught:
            raise UploadTimedOut(
                f"the upload sent nothing for {limits.idle_timeout_s:g} s "
                "(ENGINEFARM_UPLOAD_IDLE_TIMEOUT_S) and was dropped; send the body without pauses"
            )
        if chunk is None:
            return
        yield chunk


async def receive_upload(
    request: Request, spool_dir: Path, limits: UploadLimits, file_field: str = "file"
) -> ReceivedUpload:
    """Stream a multipart body to ``spool_dir``; raises 4xx errors for bad, oversized or stalled bodies.

    On any error the partial file is removed, so an interrupted upload leaves nothing behind.
    """
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise ModelRejected("send the model as multipart/form-data with a 'file' part")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limits.body_bytes:
        raise limits.body_too_large(f"it declares {declared}")
    spool_dir.mkdir(parents=True, exist_ok=True)
    receiver = _Receiver(spool_dir, limits, file_field)
    parser = MultipartParser(
        params[b"boundary"], receiver.callbacks(), max_header_count=PART_HEADERS, max_header_size=PART_HEADER_LINE_BYTES
    )

    async def counted() -> AsyncIterator[bytes]:
        received = 0
        async for chunk in _chunks(request, limits):
            received += len(chunk)
            if received > limits.body_bytes:
                raise limits.body_too_large(f"{received} bytes so far")
            yield chunk

    def write(batch: list[bytes]) -> None:
        for chunk in batch:
            parser.write(chunk)
        receiver.flush()

    try:
        await pump(counted(), write)
        parser.finalize()
        if receiver.in_file_part:
            # No closing boundary after the file: the bytes may be cut short, and no sha256 was taken.
            raise ModelRejected(
                f"malformed multipart body: it ends inside the '{file_field}' part, "
                "before the closing boundary; send the whole body"
            )
    except BaseException as exc:
        receiver.abandon()
        if isinstance(exc, MultipartParseError) and str(exc).startswith("Maximum header"):
            raise PayloadTooLarge(
                f"a part's headers are over the limit of {PART_HEADERS} lines of at most "
                f"{PART_HEADER_LINE_BYTES} bytes each; send each part with only its "
                "Content-Disposition and Content-Type headers"
            ) from exc
        if isinstance(exc, Exception) and type(exc).__module__.startswith("python_multipart"):
            raise ModelRejected(f"malformed multipart body: {exc}") from exc
        raise
    if receiver.result.path is None:
        raise ModelRejected(f"the form has no '{file_field}' part with the model")
    if receiver.result.size == 0:
        receiver.result.discard()
        raise ModelRejected("the uploaded file is empty")
    UPLOAD_BYTES.labels(file_field).inc(receiver.result.size)
    return receiver.result


async def spooled(
    request: Request,
    principal: Principal,
    settings: Settings,
    limits: UploadLimits,
    store: Callable[[Path, str, dict[str, str]], T],
) -> T:
    """``store(path, sha256, fields)`` on a worker thread, of a file uploaded within the token's upload slots and
    spooled to disk; the spool file is removed once it returns."""
    async with request.app.state.upload_slots.hold(principal, settings.max_uploads_per_token):
        upload = await receive_upload(request, settings.work_dir / worklock.SPOOL_FOLDER, limits)
        try:
            assert upload.path is not None  # receive_upload refuses a form without the file
            return await run_in_threadpool(store, upload.path, upload.sha256, upload.fields)
        finally:
            upload.discard()


async def model_upload(
    request: Request, project: str | None, principal: Principal, settings: Settings
) -> tuple[ModelOut, bool]:
    """An ONNX model uploaded through the API or the dashboard: streamed to disk, hashed on the way, validated and
    stored content-addressed within the token's upload slots; with whether it is new (False: identical bytes were
    already uploaded under this name)."""

    def store(path: Path, sha256: str, fields: dict[str, str]) -> tuple[ModelRow, bool]:
        into = ingest.upload_project(project, fields.get("project"))
        return ingest.ingest_model(settings, path, sha256, fields.get("name"), fields.get("version"), into)

    limits = UploadLimits.of(settings, settings.max_upload_bytes, "ENGINEFARM_MAX_UPLOAD_BYTES")
    row, created = await spooled(request, principal, settings, limits, store)
    return ModelOut.of(row), created
