"""Counting answers by the status that was sent (``tracer_requests_total{status}``).

Counted where the answer leaves (the ASGI ``http.response.start`` message), not where a handler
decides it: an answer a handler built as a 200 and that then failed is counted as the 500 the client
got. Paths under ``/v1/`` are counted (chat completions and the passthrough), the gateway's own
``/v1/tracer/`` endpoints are not.
"""

from __future__ import annotations

from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class CountStatus:
    """ASGI middleware: ``counter.labels(status).inc()`` once per counted request."""

    def __init__(self, app: ASGIApp, counter: Counter):
        self.app, self.counter = app, counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/v1/") or path.startswith("/v1/tracer/"):
            await self.app(scope, receive, send)
            return
        sent: list[int] = []

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:  # an exception before the answer started: the server answers 500
            self.counter.labels(str(sent[0] if sent else 500)).inc()
