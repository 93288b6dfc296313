"""Running the API under uvicorn with a listening socket of our own.

With ``--workers N`` > 1, uvicorn's keep-alive answers waited about 42 ms each on Nagle's algorithm (its open
TCP_NODELAY issue): /healthz took 44 ms against 1.4 ms with one worker. TCP_NODELAY set on the listening socket is
inherited by every connection it accepts, in every worker process, and brings it back to about 1.6 ms
(docs/performance.md has the comparison and the command)."""

from __future__ import annotations

import socket

import uvicorn
from uvicorn.supervisors import Multiprocess

from enginefarm.config import KEEP_ALIVE_SECONDS, get_settings

APP = "enginefarm.api.main:app"


def listening_socket(config: uvicorn.Config) -> socket.socket:
    sock = config.bind_socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def serve_api(host: str, port: int, workers: int = 1, log_level: str = "info") -> None:
    """Serve the API until interrupted: ``workers`` processes sharing one TCP_NODELAY listening socket."""
    config = uvicorn.Config(APP, host=host, port=port, workers=workers, log_level=log_level,
                            timeout_keep_alive=KEEP_ALIVE_SECONDS, proxy_headers=True,
                            forwarded_allow_ips=get_settings().forwarded_allow_ips)
    sock = listening_socket(config)
    try:
        if workers > 1:
            Multiprocess(config, sockets=[sock]).run()
        else:
            uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
