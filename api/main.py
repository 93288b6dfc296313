"""The farm's ASGI app, ``api.main:app``: the one ``enginefarm api`` serves (``APP`` in server/serve.py).

Every deployed form runs it through ``enginefarm api`` (server/cli.py), whose own HTTP protocol and socket
(server/serve.py) a bare ``uvicorn api.main:app`` lacks: the head's bounds (server/headlimits.py) and deadline
(``ENGINEFARM_HEADER_TIMEOUT_S``), a fleet's 304s answered by the protocol, the TCP_NODELAY socket, the farm's
keep-alive, no websocket protocol, the proxies trusted for X-Forwarded-* and /metrics summed over the worker
processes. Serve it otherwise only to measure the server itself (bench/serve.py).
"""

from api.app import create_app

app = create_app()
