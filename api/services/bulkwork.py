"""An upload's bulk work off the event loop: a thread of its own at a lower priority, which the loop feeds the body's
chunks through a bounded buffer (``pump``) or hands one job to (``run_below``, e.g. inspecting the bytes). Other
requests (``/healthz`` among them) are answered while large uploads stream in, and a slow disk slows the sender down
rather than filling the API's memory."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

T = TypeVar("T")
# Between the loop and the thread that parses, hashes and writes: at most this many chunks wait (each about
# 64-256 KiB as the server hands them over), and the thread takes up to BATCH_BYTES of them per hop.
QUEUED_CHUNKS, BATCH_BYTES = 128, 4 << 20
BULK_NICE = 10  # how much lower than the API's other threads the one that receives an upload runs


def _lower_priority() -> None:
    """Run the calling thread below the API's other threads where the system allows (Linux: a thread's own nice
    value): when the CPU is short, the event loop and short requests go first, and uploads take what is left.
    Only for threads of one's own: a pool's thread would keep the lower priority for whatever it runs next."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BULK_NICE))
    except (AttributeError, OSError):
        pass


def run_below(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` in a new thread of lower priority (``_lower_priority``); waits for it and returns
    its result or raises its exception. For bulk work on an upload's bytes, such as inspecting them."""
    result: list = []

    def run() -> None:
        _lower_priority()
        try:
            result.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread, which raises it
            result.append((False, exc))

    thread = threading.Thread(target=run, name="upload-bulk", daemon=True)
    thread.start()
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


async def pump(chunks: AsyncIterator[bytes], write: Callable[[list[bytes]], None]) -> None:
    """Feed every chunk to ``write``, run a batch at a time in a thread of its own (at a lower priority) while the
    loop goes on receiving; at most QUEUED_CHUNKS wait between the two. Nothing is being written when this returns.

    What ``write`` raises ends the receiving at once; what the receiving raises comes after the chunks already
    queued are written, so a more specific error they raise (the file's own limit) is the one the client gets.
    """
    send, receive = anyio.create_memory_object_stream[bytes](max_buffer_size=QUEUED_CHUNKS)
    token = anyio.lowlevel.current_token()
    finished = anyio.Event()
    failed: list[BaseException] = []
    stopped: Exception | None = None

    async def next_batch() -> list[bytes] | None:  # on the loop, for the thread: None once the body has ended
        try:
            batch = [await receive.receive()]
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None
        size = len(batch[0])
        while size < BATCH_BYTES:
            try:
                more = receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
            batch.append(more)
            size += len(more)
        return batch

    def end(error: BaseException | None) -> None:  # on the loop, from the thread, last
        if error is not None:
            failed.append(error)
            receive.close()
            receiving.cancel()  # the body is refused: stop reading it
        finished.set()

    def consume() -> None:
        _lower_priority()
        error = None
        try:
            while (batch := anyio.from_thread.run(next_batch, token=token)) is not None:
                write(batch)
        except BaseException as exc:  # noqa: BLE001 - handed to end(), which raises it on the event loop
            error = exc
        anyio.from_thread.run_sync(end, error, token=token)

    with anyio.CancelScope() as receiving:
        threading.Thread(target=consume, name="upload-receive", daemon=True).start()
        try:
            async with send:
                try:
                    async for chunk in chunks:
                        await send.send(chunk)
                except anyio.BrokenResourceError:
                    pass  # the writing side failed: its error is raised below
                except Exception as exc:  # noqa: BLE001 - raised below, after the stream is closed
                    stopped = exc
        finally:
            with anyio.CancelScope(shield=True):
                await finished.wait()  # the thread sees the end of the body (or a closed stream) and stops
    if failed:
        raise failed[0]
    if stopped is not None:
        raise stopped
