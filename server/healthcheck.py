"""A container's health check, for whichever role its command gave it: ``python -m server.healthcheck``.

The farm's image runs every role (API, worker, reconciler, migrations) with ``enginefarm`` as its entry point, so
one HEALTHCHECK serves them all by reading the container's own command (``/proc/1/cmdline``):

- ``api`` (and ``up``): GET /healthz on the port the command listens on;
- ``worker``: this worker's heartbeat in the catalog is younger than ENGINEFARM_WORKER_TTL_SECONDS, i.e. the farm
  itself counts it as live (a worker whose process hangs stops beating and turns unhealthy);
- ``reconcile``, ``migrate`` and anything else: healthy while the process runs (the container ends with it).

Exit status 0 is healthy, 1 unhealthy, with one line saying why.
"""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path

DEFAULT_PORT = 8321
ROLES = ("api", "up", "worker", "reconcile", "migrate", "gc", "demo")


def container_command(cmdline: Path = Path("/proc/1/cmdline")) -> list[str]:
    """PID 1's arguments: the container's command."""
    return [a for a in cmdline.read_bytes().decode(errors="replace").split("\0") if a]


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in ``args``, the last one given."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def role_of(args: list[str]) -> tuple[str | None, list[str]]:
    """The farm command in ``args`` and the arguments after it, or (None, []) for a command that is not one."""
    for i, arg in enumerate(args):
        if arg in ROLES:
            return arg, args[i + 1 :]
    return None, []


def check_api(args: list[str], timeout: float = 5.0) -> str:
    port = int(option(args, "--port") or DEFAULT_PORT)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as answer:
        if answer.status != 200:
            raise RuntimeError(f"/healthz answered {answer.status}")
    return f"api on port {port} answers /healthz"


def check_worker(args: list[str]) -> str:
    from sqlalchemy import select

    from enginefarm.core.config import get_settings
    from storage.db import quick_read
    from storage.liveness import live_workers
    from storage.tables import WorkerRow

    settings = get_settings()
    prefix = f"{option(args, '--name') or socket.gethostname()}@{socket.gethostname()}/"
    with quick_read(settings) as session:
        live = [w.id for w in live_workers(session, settings.worker_ttl_seconds) if w.id.startswith(prefix)]
        if not live:
            known = session.scalars(select(WorkerRow.id).where(WorkerRow.id.startswith(prefix))).all()
            raise RuntimeError(
                f"no heartbeat from {prefix}* in the last {settings.worker_ttl_seconds:g} s "
                f"({len(known)} silent row(s))"
            )
    return f"worker {live[-1]} is live"


def check(args: list[str]) -> str:
    """Why the container is healthy; raises when it is not."""
    role, rest = role_of(args)
    if role in ("api", "up"):
        return check_api(rest)
    if role == "worker" and "--probe" not in rest:
        return check_worker(rest)
    return f"{role or 'the container command'} is running"


def main() -> int:
    try:
        print(check(container_command()))
        return 0
    except Exception as exc:  # noqa: BLE001 - any failure is an unhealthy answer, never a traceback in the health log
        print(f"unhealthy: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
