"""The embedded mode's broker: kombu's SQLAlchemy transport, made safe for several processes on SQLite.

kombu hands every transport option to ``create_engine``, which rejects the polling and
visibility options; and SQLite needs WAL and a busy timeout when the API and several workers
share one file. This subclass does both and is registered under kombu's ``sqla`` alias.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport.sqlalchemy import Channel as _Channel
from kombu.transport.sqlalchemy import Transport as _Transport

from enginefarm.storage.db import make_engine

class Channel(_Channel):
    def _engine_from_config(self):
        # Same engine setup as the catalog's (WAL, busy timeout for SQLite; pre-ping for servers).
        return make_engine(self.connection.client.hostname)

class Transport(_Transport):
    Channel = Channel

def register() -> None:
    TRANSPORT_ALIASES["sqla"] = "enginefarm.storage.broker:Transport"
    TRANSPORT_ALIASES["sqlalchemy"] = "enginefarm.storage.broker:Transport"
