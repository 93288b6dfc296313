"""Tools the fault tests use to break things on purpose: a TCP proxy that can be cut, a PostgreSQL server of the
test's own to stop and restart, and the catalog-vs-store audit each fault test ends with."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from server import localservers
from server.embedded import free_port
from storage.db import session_scope
from storage.gc import referenced_keys
from storage.tables import BuildRow, BuildTaskRow, EngineRow, ModelRow


def slow(seconds: float) -> dict[str, str]:
    """A worker's env for the test backend: the real build, after a pause in which the test strikes."""
    return {
        "ENGINEFARM_BACKEND_WRAPPER": "tests.slow_backend:SlowBackend",
        "ENGINEFARM_TEST_BUILD_DELAY_S": str(seconds),
    }


class TcpProxy:
    """127.0.0.1:port forwarded to ``target``. ``cut()`` closes the port and every open connection (the endpoint
    is unreachable: connections are refused); ``restore()`` opens it again on the same port."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = localservers.free_port_pair()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:  # wakes the accept() blocked in the other thread; close() alone would leave the port listening
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        with self._lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def bucket_keys(settings) -> set[str]:
    from storage.blobs import get_blob_store

    return set(get_blob_store(settings).keys())


def orphans(settings, prefixes: tuple[str, ...] = ("models/", "engines/", "samples/", "references/")) -> set[str]:
    """Stored blobs under ``prefixes`` that no committed row points at. A key listed before its writer's row
    committed is looked at again under the key's lock (the one its writer holds from storing the blob until
    the commit, as the collector's last look does), so a write in flight is not taken for an orphan."""
    from storage.blobs import get_blob_store
    from storage.blobwrite import is_referenced, locked_session

    store = get_blob_store(settings)
    with session_scope(settings) as s:
        referenced = referenced_keys(s)
    left = set()
    for key in {k for k in store.keys() if k.startswith(prefixes)} - referenced:
        with locked_session(settings, key) as s:
            if not is_referenced(s, key) and store.exists(key):
                left.add(key)
    return left


def audit(settings) -> dict[str, int]:
    """Nothing lost, nothing half-written: every row's blob exists with the catalogued size, no stored engine
    or model lacks its row, no build lacks its tasks, no succeeded task lacks its engine. Returns counts."""
    from sqlalchemy import select

    from storage.blobs import get_blob_store

    store = get_blob_store(settings)
    keys = bucket_keys(settings)
    with session_scope(settings) as s:
        models = list(s.scalars(select(ModelRow)))
        engines = list(s.scalars(select(EngineRow)))
        builds = list(s.scalars(select(BuildRow)))
        tasks = list(s.scalars(select(BuildTaskRow)))
    for m in models:
        assert m.blob_key in keys and store.size(m.blob_key) == m.size, f"model {m.id}: blob {m.blob_key} missing"
        assert m.samples_key is None or m.samples_key in keys, f"model {m.id}: samples blob missing"
    for e in engines:
        assert e.blob_key in keys and store.size(e.blob_key) == e.size, f"engine {e.id}: blob {e.blob_key} missing"
    left = orphans(settings, ("models/", "engines/"))
    assert not left, f"blobs no row references: {sorted(left)[:5]}"
    with_tasks = {t.build_id for t in tasks}
    assert all(b.id in with_tasks for b in builds), "a build without tasks"
    assert all(t.engine_id is not None for t in tasks if t.state == "succeeded"), "a succeeded task without engine"
    return {"models": len(models), "engines": len(engines), "builds": len(builds), "blobs": len(keys)}


class PrivatePostgres:
    """A PostgreSQL server of its own (initdb in a temp dir, a free port), for tests that stop and restart it."""

    def __init__(self, data_dir: Path, port: int):
        self.data_dir, self.port = data_dir, port
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        bindirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
        self.bin = bindirs[-1] if bindirs else Path(shutil.which("pg_ctl") or "pg_ctl").parent

    def _run(self, tool: str, *args: str) -> None:
        # PostgreSQL refuses to run as root: run it as the postgres account there.
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, str(self.bin / tool), *args], check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data_dir / "db"), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data_dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data_dir / "db"), "-o", opts, "-l", str(self.data_dir / "pg.log"), "-w", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data_dir / "db"), "-m", mode, "-w", "stop")


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    data_dir = Path(tempfile.mkdtemp(prefix="enginefarm-pg-"))
    if os.geteuid() == 0:
        shutil.chown(data_dir, "postgres", "postgres")
    pg = PrivatePostgres(data_dir, free_port())
    pg.init()
    pg.start()
    try:
        yield pg
    finally:
        try:
            pg.stop("immediate")
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(data_dir, ignore_errors=True)
