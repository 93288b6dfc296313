"""A lean HTTP/1.1 load generator over keep-alive connections: open loop and closed loop.

Open loop: requests are scheduled at a fixed rate, spread over the connections, and each latency runs from the
request's *scheduled* time, so a stalled server is charged for every request it delayed (no coordinated
omission). Closed loop: each connection sends its next request as soon as the last is answered.

Raw asyncio streams on uvloop (where installed) rather than an HTTP client library, so that the generator, which
shares the machine's cores with the server under test, spends as little CPU per request as it can.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Request = tuple[bytes, int]  # the request's bytes, and the status it must get


@dataclass
class Result:
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> int:
        return len(self.latencies_ms)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    def summary(self) -> dict:
        return {
            "ok": self.ok,
            "errors": sum(self.errors.values()),
            "error_kinds": dict(self.errors),
            "statuses": dict(self.statuses),
            "rps": self.ok / self.seconds if self.seconds else 0.0,
            "p50_ms": self.pct(0.50),
            "p90_ms": self.pct(0.90),
            "p99_ms": self.pct(0.99),
            "max_ms": max(self.latencies_ms, default=float("nan")),
        }


def request_bytes(path: str, host: str, headers: dict[str, str]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode()


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> int:
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


class _Conn:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def send(self, req: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        try:
            return await _exchange(self.reader, self.writer, req)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def _one(conn: _Conn, req: Request, res: Result, since: float, timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):  # no task per request, as wait_for makes
            status = await conn.send(req[0])
    except TimeoutError:
        res.error("timeout")
        return
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        res.error(type(exc).__name__)
        return
    res.statuses[status] = res.statuses.get(status, 0) + 1
    if status == req[1]:
        res.latencies_ms.append((time.perf_counter() - since) * 1000)
    else:
        res.error(f"HTTP {status}")


async def open_loop(
    host: str,
    port: int,
    pick: Callable[[int], Request],
    rate: float,
    connections: int,
    seconds: float,
    timeout: float = 10.0,
) -> Result:
    """``rate`` requests/s for ``seconds``, request k on connection k % connections, scheduled at start + k/rate."""
    res, total = Result(), int(rate * seconds)
    conns = [_Conn(host, port) for _ in range(connections)]
    start = time.perf_counter() + 0.5

    async def lane(c: int) -> None:
        for k in range(c, total, connections):
            at = start + k / rate
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await _one(conns[c], pick(k), res, at, timeout)

    await asyncio.gather(*(lane(c) for c in range(connections)))
    res.seconds = time.perf_counter() - start
    for c in conns:
        c.close()
    return res


async def closed_loop(
    host: str, port: int, pick: Callable[[int], Request], connections: int, seconds: float, timeout: float = 10.0
) -> Result:
    """``connections`` clients, each sending its next request when the last is answered, for ``seconds``."""
    res = Result()
    conns = [_Conn(host, port) for _ in range(connections)]
    start = time.perf_counter()
    stop = start + seconds
    counter = iter(range(1 << 62))

    async def client(c: int) -> None:
        while time.perf_counter() < stop:
            await _one(conns[c], pick(next(counter)), res, time.perf_counter(), timeout)

    await asyncio.gather(*(client(c) for c in range(connections)))
    res.seconds = time.perf_counter() - start
    for c in conns:
        c.close()
    return res


def run(coro):
    """Run a load coroutine on uvloop where it is installed (``enginefarm[server]`` brings it), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
