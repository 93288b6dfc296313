"""Worker ids: ``NAME@HOST/INSTANCE``. The instance part is new at every start of a worker process, so a worker
that crashed and was started again under the same name is a different worker: the heartbeats of the new process
never keep the dead one's running tasks alive, and the reconciler requeues them once the old id falls silent."""

from __future__ import annotations

import os
import secrets
import socket

# A worker's id, set by ``enginefarm worker`` for its processes (pool children inherit it).
WORKER_ID_ENV = "ENGINEFARM_WORKER_ID"
# The name of a worker started without one (a Celery worker started by hand).
UNNAMED = "worker"
_own: tuple[int, str] | None = None

# The catalog keeps worker ids in columns of 200 characters: a host name is at most 64, the instance part 9.
MAX_NAME_LENGTH = 100


def check_worker_name(name: str) -> str:
    """``name`` if a worker may use it; ValueError saying what to change otherwise."""
    if not name or "@" in name or "/" in name or len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise ValueError(
            f"worker name {name!r} cannot be used: give 1 to {MAX_NAME_LENGTH} printable characters "
            f"without '@' or '/' (the worker id is NAME@HOST/INSTANCE)"
        )
    return name


def new_worker_id(name: str, hostname: str | None = None) -> str:
    """A fresh id for one start of the worker ``name``."""
    return f"{check_worker_name(name)}@{hostname or socket.gethostname()}/{secrets.token_hex(4)}"


def current_worker_id() -> str:
    """This process's worker id: the one ``enginefarm worker`` set, else one of its own, new in every process."""
    global _own
    given = os.environ.get(WORKER_ID_ENV)
    if given:
        return given
    if _own is None or _own[0] != os.getpid():  # a forked pool process is a worker of its own
        _own = (os.getpid(), new_worker_id(UNNAMED))
    return _own[1]


def worker_name(worker_id: str) -> str:
    """The name part of a worker id (the whole of an id written without one)."""
    return worker_id.split("@", 1)[0]
