"""The farm's ASGI app, ``api.main:app``: the one ``enginefarm api`` serves (``APP`` in
server/serve.py).

Run the API with ``enginefarm api`` (options ``--host`` (127.0.0.1), ``--port`` (8321), ``--workers`` (1),
``--log-level`` (info); server/cli.py), as every deployed form does: ``enginefarm up`` and the files
in deploy/. It serves this app under uvicorn with the server's own HTTP protocol and socket
(server/serve.py), which a bare ``uvicorn api.main:app`` does not have. Served that way,
the API loses:

- the bounds on a request's head, judged before it is parsed (server/headlimits.py): a request line
  past ``ENGINEFARM_MAX_REQUEST_LINE_BYTES`` (414), a header block past ``ENGINEFARM_MAX_HEADER_BYTES`` or
  ``ENGINEFARM_MAX_HEADER_FIELDS`` lines (431), at most 32 pipelined requests waiting parsed. uvicorn's own
  protocol keeps whatever a client sends before the end of its headers;
- the header deadline: a request's line and headers get ``ENGINEFARM_HEADER_TIMEOUT_S`` to arrive, then a 408
  and a close. uvicorn holds a silent connection, or one dribbling its headers, for ever;
- the 304 a fleet's unchanged conditional resolve gets from the protocol itself, before any ASGI work (the app
  still answers it, at about the cost of a cached 200);
- the TCP_NODELAY listening socket (with ``--workers`` > 1 uvicorn's keep-alive answers wait about 40 ms on
  Nagle's algorithm), the farm's keep-alive (75 s), no websocket protocol (``ws="none"``), the proxies trusted for
  X-Forwarded-* from ``ENGINEFARM_FORWARDED_ALLOW_IPS``, and /metrics summed over the worker processes (a
  prometheus-client multiprocess folder).

Serve it otherwise only to measure the server itself (docs/performance.md's comparisons, bench/serve.py).
"""

from api.app import create_app

app = create_app()
