"""Is a TCP port free to serve on? Asked before any work that ends by serving on it (``make demo``,
``enginefarm demo --serve``), so a taken port is one line at once rather than a failure after the demo ran.

Standard library only: ``make demo`` runs it with the system Python (``python3 -m server.port PORT``)
before it sets up the demo's environment.
"""

from __future__ import annotations

import socket
import sys

HOST = "127.0.0.1"


def port_in_use(port: int, host: str = HOST) -> bool:
    """Whether binding ``host:port`` fails, as the API's own bind would. SO_REUSEADDR as uvicorn sets it, so the
    TIME_WAIT connections a farm that just stopped leaves behind do not count as a listener."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port_after(port: int, host: str = HOST, tries: int = 50) -> int | None:
    """The first free port after ``port`` (up to ``tries`` of them), to suggest instead; None if all are taken."""
    return next((p for p in range(port + 1, min(port + 1 + tries, 65536)) if not port_in_use(p, host)), None)


def taken_message(port: int, host: str = HOST) -> str | None:
    """One line saying the port is taken and which one to use instead; None when the port is free."""
    if not port_in_use(port, host):
        return None
    other = free_port_after(port, host)
    instead = (
        f"choose another, e.g. make demo PORT={other} (enginefarm demo --serve --port {other})"
        if other
        else "choose another with make demo PORT=N (enginefarm demo --serve --port N)"
    )
    return f"port {port} on {host} is in use; {instead}"


def main(argv: list[str] | None = None) -> int:
    """``python -m server.port PORT``: exit 0 if the port is free, else one line on stderr and exit 2."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit() or not 0 < int(args[0]) < 65536:
        print(
            f"usage: python -m server.port PORT (1-65535), not {' '.join(args) or 'nothing'}",
            file=sys.stderr,
        )
        return 2
    message = taken_message(int(args[0]))
    if message:
        print(message, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
