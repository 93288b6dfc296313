"""``Cache-Control: no-store`` on every /v1 answer that says nothing of caching.

A /v1 answer depends on the asking token (its project, its scope), and a shared cache keys what it keeps by URL
alone. Many keep a 200 that says nothing (nginx's ``proxy_cache_valid 200 10m``, a CDN's default time): another
project's token, or none, would then be handed the first token's model records, builds and reports. Answers
that may be kept say so themselves (downloads: ``private, immutable``; resolve: ``private, no-cache``)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

NO_STORE = (b"cache-control", b"no-store")


class NoStoreByDefault:
    """ASGI middleware: adds ``Cache-Control: no-store`` to /v1 answers that carry no Cache-Control."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return

        async def send_with_default(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers") or []
                if not any(name.lower() == b"cache-control" for name, _ in headers):
                    message["headers"] = [*headers, NO_STORE]
            await send(message)

        await self.app(scope, receive, send_with_default)
