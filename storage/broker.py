"""The embedded mode's broker: kombu's SQLAlchemy transport, made safe for several processes on SQLite, and cheap
to poll.

kombu hands every transport option to ``create_engine``, which rejects the polling and visibility options; and
SQLite needs WAL and a busy timeout when the API and several workers share one file. This subclass does both and
is registered under kombu's ``sqla`` alias.

Polling: kombu asks each queue in turn, each ask a lookup of the queue's row plus a write transaction (``BEGIN
IMMEDIATE`` on SQLite) around a select, so an idle worker contends for the file's write lock with the API and every
other worker. Here one poll is one read across all the consumer's queues; the write lock is taken only when a
message is waiting, to take the oldest one (first in, first out across the queues, as the builds were submitted).

Rows: kombu marks a message taken (``visible``) and keeps its row for ever, so every poll's scan grows with the
farm's life. Here a taken message's row is deleted in the transaction that takes it, and the rows that earlier
farms left in the file are deleted when a process first opens it.

Connections: kombu's channel opens a session on first use and never closes it, and its ``_size`` (a queue's depth,
asked by ``queue_size``) leaves the session's read open, holding a connection of the broker's pool until the garbage
collector frees the channel. Here a read ends when it is answered and a channel gives its session's connection back
when it closes.

Waking: between two polls kombu sleeps the polling interval, also when it polls nothing because the worker is
busy (its one prefetched task unacknowledged). Here that sleep ends as soon as a message is acknowledged or
rejected, so a worker that finishes a task asks for the next one at once rather than up to one interval later.
"""

from __future__ import annotations

import threading
from queue import Empty
from time import monotonic

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport.sqlalchemy import Channel as _Channel
from kombu.transport.sqlalchemy import Transport as _Transport
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from sqlalchemy import delete, select, text

from storage.db import make_engine


class Channel(_Channel):
    _swept: set[str] = set()  # broker URLs whose taken rows this process has deleted

    def _engine_from_config(self):
        # Same engine setup as the catalog's (WAL, busy timeout for SQLite; pre-ping for servers).
        return make_engine(self.connection.client.hostname)

    def _open(self):
        engine, session_maker = super()._open()
        url = self.connection.client.hostname
        if url not in Channel._swept:
            Channel._swept.add(url)
            message = self.message_cls
            with engine.begin() as conn:  # taken before messages were deleted when taken; no one reads them again
                conn.execute(delete(message).where(message.visible == False))  # noqa: E712 (SQL, not Python)
        return engine, session_maker

    def _waiting(self, queues: list[str]):
        """The oldest visible message in any of ``queues`` and its queue's name (a select, not yet taken)."""
        message, queue = self.message_cls, self.queue_cls
        return (
            select(message, queue.name)
            .join(queue, message.queue_id == queue.id)
            .where(queue.name.in_(queues), message.visible != False)  # noqa: E712 (SQL, not Python)
            .order_by(message.sent_at, message.id)
            .limit(1)
        )

    def _take(self, queues: list[str]) -> tuple[dict, str] | None:
        session = self.session
        try:  # a plain read first: an idle poll takes no lock
            if session.execute(self._waiting(queues).with_only_columns(self.message_cls.id)).first() is None:
                return None
        finally:
            session.commit()  # ends the read, so the next poll sees new messages
        sqlite = session.bind.dialect.name == "sqlite"
        if sqlite:
            session.execute(text("BEGIN IMMEDIATE TRANSACTION"))
        try:
            query = self._waiting(queues)
            if not sqlite:  # another worker's message in flight is skipped, not waited for
                query = query.with_for_update(of=self.message_cls, skip_locked=True)
            row = session.execute(query).first()
            if row is None:  # another consumer took it between the read and the lock
                return None
            message, name = row
            payload = loads(bytes_to_str(message.payload))
            session.delete(message)
            return payload, name
        finally:
            session.commit()

    def _get(self, queue):
        taken = self._take([queue])
        if taken is None:
            raise Empty()
        return taken[0]

    def _get_many(self, queues, timeout=None):
        """Deliver one message from any of ``queues`` (kombu's virtual channel calls this when it exists)."""
        taken = self._take(list(queues))
        if taken is None:
            raise Empty()
        payload, queue = taken
        self.connection._deliver(payload, queue)

    def _size(self, queue):
        try:
            return super()._size(queue)
        finally:
            self.session.commit()  # ends the read: its connection goes back to the pool

    def close(self):
        try:
            super().close()
        finally:
            session, self._session = self._session, None
            if session is not None:
                session.close()  # kombu leaves it to the garbage collector, holding a pooled connection

    def basic_ack(self, delivery_tag, multiple=False):
        super().basic_ack(delivery_tag, multiple)
        self.connection.wake.set()  # the worker can take its next message now

    def basic_reject(self, delivery_tag, requeue=False):
        super().basic_reject(delivery_tag, requeue)
        self.connection.wake.set()


class Transport(_Transport):
    Channel = Channel

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        self.wake = threading.Event()

    def drain_events(self, connection, timeout=None):
        """kombu's virtual ``drain_events``, but the sleep between polls ends early on ``wake``."""
        started = monotonic()
        interval = self.polling_interval
        if timeout and interval and interval > timeout:
            interval = timeout
        while True:
            self.wake.clear()  # before polling: a wake that comes after the poll is not lost
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                if timeout is not None and monotonic() - started >= timeout:
                    raise TimeoutError() from None
                if interval is not None:
                    self.wake.wait(interval)


def register() -> None:
    TRANSPORT_ALIASES["sqla"] = "storage.broker:Transport"
    TRANSPORT_ALIASES["sqlalchemy"] = "storage.broker:Transport"
