"""The embedded broker gives back its connections: asking a queue's depth, as the reconciler does on every pass while
a GPU benchmark waits for a worker that never comes, leaves no connection checked out of the broker's pool."""

from __future__ import annotations

import gc
import os
import sqlite3
from pathlib import Path

import pytest

from enginefarm.core.config import Settings
from storage import broker
from storage.queue import make_celery


def open_files_on(path: Path) -> int:
    """This process's open descriptors on ``path`` and its WAL and shared-memory files."""
    names = {str(path), f"{path}-wal", f"{path}-shm"}
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") in names
        except OSError:
            pass
    return count


@pytest.fixture
def no_cycle_collection():
    """kombu's channels sit in reference cycles: only the cycle collector would free what a closed one kept."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_asking_a_queues_depth_keeps_no_connection(tmp_path, no_cycle_collection):
    settings = Settings(data_dir=tmp_path, blob_store="local")
    app = make_celery(settings)
    pools = []
    for _ in range(40):  # more than the pool's 5 + 10: on kombu's own channel the 16th waited 30 s and failed
        with app.connection_for_read() as conn:
            assert conn.default_channel.queue_declare(queue="bench.tensorrt-rtx.sm86", passive=True).message_count == 0
        engine = broker.Channel._engines[conn.hostname][0]
        pools.append(engine.pool.checkedout())
    assert max(pools) == 0, pools
    # And the database file is held open by the pool's one idle connection at most, not one per question.
    assert open_files_on(tmp_path / "broker.db") <= 3


def test_a_message_published_and_counted_is_still_delivered(tmp_path, no_cycle_collection):
    """The depth's read is ended with a commit; a message sent meanwhile by another connection is seen."""
    settings = Settings(data_dir=tmp_path, blob_store="local")
    app = make_celery(settings)
    with app.connection_for_read() as reader, app.connection_for_write() as writer:
        channel = reader.default_channel
        assert channel.queue_declare(queue="q", passive=True).message_count == 0
        writer.SimpleQueue("q").put({"n": 1})
        assert channel.queue_declare(queue="q", passive=True).message_count == 1


def test_a_taken_message_leaves_no_row(tmp_path):
    """kombu kept every taken message's row for ever: the table, and every poll's scan, grew by one per task."""
    settings = Settings(data_dir=tmp_path, blob_store="local")
    app = make_celery(settings)
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue("q")
        for n in range(25):
            queue.put({"n": n})
        got = [queue.get(timeout=5) for _ in range(25)]
        for message in got:
            message.ack()
        assert [m.payload["n"] for m in got] == list(range(25))  # first in, first out
        queue.close()
    assert message_rows(tmp_path / "broker.db") == 0


def test_rows_an_earlier_farm_left_are_deleted_when_the_file_is_opened(tmp_path):
    db = tmp_path / "broker.db"
    make_celery(Settings(data_dir=tmp_path, blob_store="local")).connection_for_write().SimpleQueue("q").put({})
    with sqlite3.connect(db) as conn:  # as kombu's own channel left a taken message, and one still waiting
        conn.execute(
            "INSERT INTO kombu_message (visible, timestamp, payload, version, queue_id) "
            "SELECT 0, timestamp, payload, version, queue_id FROM kombu_message"
        )
    assert message_rows(db) == 2
    broker.Channel._swept.clear()  # a new process
    app = make_celery(Settings(data_dir=tmp_path, blob_store="local"))
    with app.connection_for_read() as conn:
        assert conn.default_channel.queue_declare(queue="q", passive=True).message_count == 1
    assert message_rows(db) == 1


def message_rows(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM kombu_message").fetchone()[0]
