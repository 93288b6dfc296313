"""Bounds on a request's head, judged as its bytes arrive, before the HTTP parser sees them.

uvicorn's httptools protocol keeps whatever a client sends before a request's end of headers. Here, as nginx,
gunicorn and h11 do:

- the request line (without its CRLF) past ``ENGINEFARM_MAX_REQUEST_LINE_BYTES`` (8 KiB): 414 URI Too Long;
- the header block (the lines after the request line, through the empty line that ends them) past
  ``ENGINEFARM_MAX_HEADER_BYTES`` (64 KiB), or more than ``ENGINEFARM_MAX_HEADER_FIELDS`` (100) header lines:
  431 Request Header Fields Too Large. A chunked body's trailer section has the same two bounds.

Each read is scanned for the head's end before any of it reaches the parser, with the counts carried across
reads. A refused head gets a short plain answer (after the answers to earlier pipelined requests), the connection
stops reading, its write side is shut, and it is closed once the client closes, ``LINGER_S`` later or once
``LINGER_BYTES`` more were read and dropped, whichever comes first.

A body is followed by its framing (Content-Length, or chunk sizes, data and trailers) so the next head is counted
from its first byte; where that framing and the parser disagree on where a message ends, the connection is closed
(400). Blank lines between requests are bounded by the header deadline (serve.py), not here.

Pipelined requests: at most ``MAX_PIPELINED`` wait parsed; the bytes after them wait unparsed, reading paused,
until an answer makes room, and a connection with more than ``MAX_HELD_BYTES`` so waiting is closed."""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

# How long a refused connection is read (and what it sends dropped) after its answer, at most, before the close.
LINGER_S = 2.0
LINGER_BYTES = 256 << 10
# Parsed requests waiting for the answers before them, at most; and unparsed bytes after them.
MAX_PIPELINED = 32
MAX_HELD_BYTES = 1 << 20

_BLANK = re.compile(rb"[\r\n]*")
_HEX = re.compile(rb"[0-9A-Fa-f]*")
_END = b"\r\n\r\n"
# Where the connection is in its stream of requests.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _REFUSED = range(8)
_CHUNKED = frozenset({_CHUNK_SIZE, _CHUNK_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILERS})


@dataclass(frozen=True)
class HeadLimits:
    """A request line's bytes (without its CRLF); the header block's bytes (after the request line, through the
    empty line); its header lines. The settings' ``max_request_line_bytes``, ``max_header_bytes`` and
    ``max_header_fields``."""

    request_line: int = 8 << 10
    header_bytes: int = 64 << 10
    header_fields: int = 100


def refusal(status: int, reason: str, text: str) -> bytes:
    body = text.encode() + b"\n"
    return b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n" % (
        status,
        reason.encode(),
    ) + b"content-length: %d\r\n\r\n%s" % (len(body), body)


class HeadLimitProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with each request's head bounded before it is parsed."""

    def __init__(self, *args, limits: HeadLimits | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits or HeadLimits()
        self._phase = _HEAD
        self._started = False  # the head's first byte past blank lines has come
        self._line = 0  # its request line's bytes so far (a CR before the LF included); -1 once the line ended
        self._cr = False  # the last byte of the request line so far is a CR
        self._block = 0  # bytes of the header block (or trailer section) so far
        self._lines = 0  # line feeds in it so far
        self._tail = b""  # its last three bytes (from the request line's CRLF on): an end split between reads
        self._left = 0  # bytes of the body, or of the chunk, still to come; a chunk's size while read
        self._ended = False  # the parser ended a message in what it was last fed
        self._refusal = b""  # the answer to a refused head, until written
        self._behind = False  # ... behind an earlier answer that the queue no longer shows (_drop_request)
        self._linger: asyncio.TimerHandle | None = None
        self.refused = False  # a head broke a limit: answered (or to be), and the connection closing
        self._drained = 0  # bytes read and dropped since the answer to a refused head
        self._held = b""  # bytes not parsed until the pipelined requests before them are answered, ...
        self._held_at = 0  # ... from this offset

    def data_received(self, data: bytes) -> None:
        if self._held:
            self._hold(data, 0)
            return
        n = len(data)
        if self._phase == _HEAD and not self._started and n > 4 and data[0] > 13 and not self.pipeline:
            # The usual read, one whole head from its first byte to the read's end: bounded without the scan below.
            lf = data.find(b"\n")
            limits = self.limits
            if (
                lf > 0
                and data.find(_END, lf - 1) == n - 4
                and lf - (data[lf - 1] == 13) <= limits.request_line
                and n - lf - 1 <= limits.header_bytes
                # a header line the parser takes has 4 bytes at least ("a:" and its CRLF): a short block needs no
                # count (what it holds besides is refused by the parser)
                and (n - lf - 3 <= 4 * limits.header_fields or data.count(b"\n", lf + 1) <= limits.header_fields + 1)
            ):
                self._ended = False
                HttpToolsProtocol.data_received(self, data)
                if not self._ended and not self.transport.is_closing() and self in self.connections:
                    self._after_head()  # a body follows
                return
        self._receive(data, 0)

    def _receive(self, data: bytes, pos: int) -> None:
        """Bound, frame and parse ``data`` from ``pos``."""
        n = len(data)
        while pos < n:
            phase = self._phase
            if phase == _HEAD and not self._started and len(self.pipeline) >= MAX_PIPELINED:
                self._hold(data, pos)
                return
            if phase == _HEAD:
                end, whole = self._head(data, pos)
            elif phase == _LENGTH:
                end = pos + min(self._left, n - pos)
                self._left -= end - pos
                whole = not self._left
            elif phase in _CHUNKED:
                end, whole = self._chunks(data, pos)
            else:  # refused: dropped, unparsed
                if self._refusal:
                    self.transport.pause_reading()  # resumed by the flow control of an earlier answer
                elif self._linger is not None:
                    self._drained += n
                    if self._drained > LINGER_BYTES:
                        self.transport.close()
                return
            if end < 0:  # refused
                return
            self._ended = False
            super().data_received(data if pos == 0 and end == n else memoryview(data)[pos:end])  # type: ignore[arg-type]
            if self.transport.is_closing() or self not in self.connections:  # a 400, or handed to another protocol
                return
            pos = end
            if phase == _HEAD:
                if whole and not self._after_head():
                    return
            elif self._ended != whole:  # its framing and the parser's disagree on where the message ends
                self._refuse(400, "Bad Request", "the request's body does not end where its framing says")
                return
            elif whole:
                self._next_message()

    def _hold(self, data: bytes, pos: int) -> None:
        """Keep ``data`` from ``pos`` unparsed, reading paused, until an answer makes room in the queue
        (``on_response_complete``)."""
        if self._held:  # more came meanwhile (an app that asked for its body let the reading resume)
            data, pos = self._held[self._held_at :] + data[pos:], 0
        self._held, self._held_at = data, pos
        if len(data) - pos > MAX_HELD_BYTES:
            log.info(
                "%s: %d pipelined requests waiting and more than %d bytes after them; closed",
                self.client,
                MAX_PIPELINED,
                MAX_HELD_BYTES,
            )
            self.transport.close()
        else:
            self.flow.pause_reading()

    def on_message_complete(self) -> None:
        self._message_ended()
        super().on_message_complete()

    def _message_ended(self) -> None:
        self._ended = True

    def _next_message(self) -> None:
        self._phase = _HEAD
        self._started = False
        self._line = 0
        self._cr = False

    def _head(self, data: bytes, pos: int) -> tuple[int, bool]:
        """Where in ``data`` the head that ``pos`` is in ends (just past it; len(data) if not in this read) and
        whether it ends there; (-1, False) where it breaks a limit (refused)."""
        n = len(data)
        if not self._started:
            pos = _BLANK.match(data, pos).end()  # type: ignore[union-attr]
            if pos == n:
                return n, False
            self._started = True
        if self._line >= 0:
            lf = data.find(b"\n", pos)
            stop = n if lf < 0 else lf
            if stop > pos:
                self._line += stop - pos
                self._cr = data[stop - 1] == 13
            if self._line - self._cr > self.limits.request_line:
                return self._refuse(
                    414, "URI Too Long", f"the request line is longer than {self.limits.request_line} bytes"
                )
            if lf < 0:
                return n, False
            self._line = -1
            self._block = self._lines = 0
            self._tail = b"\r\n"
            pos = lf + 1
        return self._block_end(data, pos)

    def _block_end(self, data: bytes, pos: int) -> tuple[int, bool]:
        """The header block (or trailer section) from ``pos``: its end, as ``_head``."""
        n = len(data)
        tail = self._tail
        end = (tail + data[pos : pos + 3]).find(_END)
        if end >= 0:
            end += pos + 4 - len(tail)
        else:
            end = data.find(_END, pos)
            if end >= 0:
                end += 4
        stop = n if end < 0 else end
        size = self._block + stop - pos
        lines = self._lines + data.count(b"\n", pos, stop) - (end >= 0)  # the empty line is no field
        if size > self.limits.header_bytes:
            return self._refuse(
                431,
                "Request Header Fields Too Large",
                f"the header fields are larger than {self.limits.header_bytes} bytes",
            )
        if lines > self.limits.header_fields:
            return self._refuse(
                431, "Request Header Fields Too Large", f"there are more than {self.limits.header_fields} header fields"
            )
        if end >= 0:
            return end, True
        self._block, self._lines = size, lines
        self._tail = (tail + data[max(pos, n - 3) : n])[-3:]
        return n, False

    def _after_head(self) -> bool:
        """The parser has the whole head: the message ended (no body) or its body comes next, framed as its
        headers say. False where the connection was refused."""
        if self._ended:
            self._next_message()
            return True
        chunked = length = None
        for name, value in self.headers:
            if name == b"transfer-encoding":
                chunked = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
            elif name == b"content-length":
                length = value.strip()
        if chunked:
            self._phase, self._left = _CHUNK_SIZE, 0
        elif chunked is None and length is not None and length.isdigit() and int(length) > 0:
            self._phase, self._left = _LENGTH, int(length)
        else:
            self._refuse(400, "Bad Request", "the request's body has no framing this server follows")
            return False
        return True

    def _chunks(self, data: bytes, pos: int) -> tuple[int, bool]:
        """How far into ``data`` the chunked body goes: (its end, True) where it ends in this read, (len(data),
        False) where it goes on, (-1, False) where its trailers break a limit (refused)."""
        n = len(data)
        while pos < n:
            phase = self._phase
            if phase == _CHUNK_SIZE:
                stop = _HEX.match(data, pos).end()  # type: ignore[union-attr]
                if stop > pos:
                    if self._left < 1 << 64:  # past that the parser refuses the size, and closes
                        self._left = (self._left << 4 * (stop - pos)) | int(data[pos:stop], 16)
                    pos = stop
                if pos < n:
                    self._phase = _CHUNK_LINE  # extensions, if any, then the line's end
            elif phase == _CHUNK_LINE or phase == _CHUNK_END:
                lf = data.find(b"\n", pos)
                if lf < 0:
                    return n, False
                pos = lf + 1
                if phase == _CHUNK_END:
                    self._phase = _CHUNK_SIZE
                elif self._left:
                    self._phase = _CHUNK_DATA
                else:  # the last chunk: the trailer section, bounded as a header block
                    self._phase = _TRAILERS
                    self._block = self._lines = 0
                    self._tail = b"\r\n"
            elif phase == _CHUNK_DATA:
                take = min(self._left, n - pos)
                pos += take
                self._left -= take
                if not self._left:
                    self._phase = _CHUNK_END
            else:
                return self._block_end(data, pos)
        return n, False

    def _refuse(self, status: int, reason: str, text: str) -> tuple[int, bool]:
        log.info("%s: %s; %d and a close", self.client, text, status)
        in_body = self._phase == _TRAILERS  # the request is the app's already
        self._phase = _REFUSED
        self.refused = True
        self._refusal = refusal(status, reason, text)
        if in_body and self._drop_request():
            self.transport.close()  # its answer has begun: no other can follow it
        elif self._answering():
            self.transport.pause_reading()  # the earlier requests' answers first (on_response_complete)
        else:
            self._send_refusal()
        return -1, False

    def _drop_request(self) -> bool:
        """The request being read leaves the app (which hears a disconnect) and the queue; True where its answer
        has begun."""
        cycle = self.cycle
        cycle.disconnected = True
        cycle.message_event.set()
        for entry in self.pipeline:
            if entry[0] is cycle:
                self.pipeline.remove(entry)
                self._behind = True  # an earlier answer is being written
                break
        return cycle.response_started and not cycle.response_complete

    def _answering(self) -> bool:
        """An earlier request's answer is being written, or waits its turn."""
        cycle = self.cycle
        return (
            self._behind
            or bool(self.pipeline)
            or (cycle is not None and not cycle.response_complete and not cycle.disconnected)
        )

    def _send_refusal(self) -> None:
        self.transport.write(self._refusal)
        self._refusal = b""
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.transport.resume_reading()  # what the client still sends is read and dropped until it closes
        self._linger = self.loop.call_later(LINGER_S, self.transport.close)

    def on_response_complete(self) -> None:
        next_starts = bool(self.pipeline)
        super().on_response_complete()
        if self._held and not self.transport.is_closing() and len(self.pipeline) < MAX_PIPELINED:
            held, self._held = self._held, b""
            self._receive(held, self._held_at)  # as if read now; what is held again pauses the reading again
        if self._refusal and not next_starts and not self.transport.is_closing():
            self._behind = False
            if not self._answering():
                self._send_refusal()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        super().connection_lost(exc)
