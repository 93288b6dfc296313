"""Streaming multipart uploads: the file goes to disk chunk by chunk, hashed on the way.

FastAPI's ``UploadFile`` would spool the whole body before the route runs and enforces no size
limit; here the limit is checked while the bytes arrive and the sha256 is ready at the end.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header

from enginefarm.errors import ModelRejected, PayloadTooLarge

MAX_FIELD_BYTES = 64 << 10


@dataclass
class ReceivedUpload:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    path: Path | None = None
    size: int = 0
    sha256: str = ""

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class _Receiver:
    """Callbacks for python-multipart's streaming parser: fields to memory (small), the file to disk."""

    def __init__(self, spool_dir: Path, max_bytes: int, file_field: str):
        self.spool_dir, self.max_bytes, self.file_field = spool_dir, max_bytes, file_field
        self.result = ReceivedUpload()
        self._headers: dict[bytes, bytes] = {}
        self._header_name = b""
        self._header_value = b""
        self._name: str | None = None
        self._buf = bytearray()
        self._fh = None
        self._digest = hashlib.sha256()

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self._part_begin, "on_part_data": self._part_data, "on_part_end": self._part_end,
            "on_header_field": self._header_field, "on_header_value": self._header_val,
            "on_header_end": self._header_end, "on_headers_finished": self._headers_done,
        }

    def _part_begin(self) -> None:
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
            fd, tmp = tempfile.mkstemp(dir=self.spool_dir, prefix="upload-")
            self._fh = os.fdopen(fd, "wb")
            self.result.path = Path(tmp)

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._fh is not None:
            self.result.size += len(chunk)
            if self.result.size > self.max_bytes:
                raise PayloadTooLarge(f"upload is larger than the limit of {self.max_bytes} bytes")
            self._digest.update(chunk)
            self._fh.write(chunk)
        else:
            self._buf += chunk
            if len(self._buf) > MAX_FIELD_BYTES:
                raise ModelRejected(f"form field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes")

    def _part_end(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self.result.sha256 = self._digest.hexdigest()
        elif self._name:
            self.result.fields[self._name] = self._buf.decode("utf-8", "replace")

    @property
    def in_file_part(self) -> bool:
        """The file part has begun and not ended (its closing boundary has not arrived)."""
        return self._fh is not None

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


async def receive_upload(request: Request, spool_dir: Path, max_bytes: int, file_field: str = "file") -> ReceivedUpload:
    """Stream a multipart body to ``spool_dir``; raises 4xx errors for bad or oversized bodies.

    On any error the partial file is removed, so an interrupted upload leaves nothing behind.
    """
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise ModelRejected("send the model as multipart/form-data with a 'file' part")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes + MAX_FIELD_BYTES:
        raise PayloadTooLarge(f"upload of {declared} bytes is larger than the limit of {max_bytes} bytes")
    spool_dir.mkdir(parents=True, exist_ok=True)
    receiver = _Receiver(spool_dir, max_bytes, file_field)
    parser = MultipartParser(params[b"boundary"], receiver.callbacks())
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
        if receiver.in_file_part:
            # No closing boundary after the file: the bytes may be cut short, and no sha256 was taken.
            raise ModelRejected(f"malformed multipart body: it ends inside the '{file_field}' part, "
                                "before the closing boundary; send the whole body")
    except BaseException as exc:
        receiver.close()
        receiver.result.discard()
        if isinstance(exc, (ModelRejected, PayloadTooLarge)):
            raise
        if isinstance(exc, Exception) and type(exc).__module__.startswith("python_multipart"):
            raise ModelRejected(f"malformed multipart body: {exc}") from exc
        raise
    receiver.close()
    if receiver.result.path is None:
        raise ModelRejected(f"the form has no '{file_field}' part with the model")
    if receiver.result.size == 0:
        receiver.result.discard()
        raise ModelRejected("the uploaded file is empty")
    return receiver.result
