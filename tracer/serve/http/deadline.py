"""A deadline on reading each request, for uvicorn (which has none: a client that sends its headers
one byte at a time holds its connection, a task and a parser for as long as it likes).

**Why a subclass, and not a uvicorn setting.** uvicorn (checked on :data:`CHECKED_UVICORN`) bounds a
connection only *between* requests: ``timeout_keep_alive`` is armed when an answer completes and
cancelled by the next request's first byte, so neither a connection that sends nothing nor one that
drips its headers is ever timed out. Its other limits bound how much, not how long
(``h11_max_incomplete_event_size`` is the h11 parser's header size; we run httptools),
``limit_concurrency`` answers 503 past a number of connections and tasks, and the other ``timeout_*``
settings concern the server's own life (workers, shutdown). So the deadline hooks the httptools parser's
callbacks, the smallest place that sees a request's first and last byte. It relies on uvicorn internals
(``HttpToolsProtocol``'s callbacks, ``cycle``, ``loop``, ``transport``): tests/unit/serve/test_deadline_pin.py
fails when the installed uvicorn is another minor version or grows a setting of this kind, and
tests/integration/serve/test_gateway_slow_clients.py checks the behaviour on a real server.

:func:`deadline_protocol` makes a subclass of uvicorn's httptools protocol, passed as
``uvicorn.Config(http=...)``. Each request must arrive, headers and body, within ``timeout_s`` of its
first byte (of the connection's opening, for the first request). When the deadline passes:

- headers incomplete: ``408`` and the connection closed (no request reached the app);
- the app is running: the connection is closed once its answer is sent; the app's own body deadline
  (:func:`tracer.serve.http.guards.read_body`, the same ``timeout_s`` from the end of the headers) answers
  the 408 when it was waiting for the body;
- the answer was already sent and the body still has not come: the connection is closed.

A connection that finished its request and waits for the next one is uvicorn's keep-alive timeout's
business. The timer is one ``call_later`` per request, cancelled when the request's last byte arrives.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("tracer.serve")

# the uvicorn (major, minor) whose internals and settings this module was checked against
CHECKED_UVICORN = (0, 55)


def deadline_protocol(timeout_s: float, on_expired: Callable[[str], None] = lambda kind: None) -> type:
    """An ``http=`` protocol class for uvicorn with a ``timeout_s`` read deadline per request;
    ``on_expired("header_timeout" | "body_timeout")`` counts each expiry."""
    body = json.dumps({"error": {"message": f"the request did not arrive within {timeout_s} s",
                                 "type": "invalid_request_error", "param": None, "code": None}}).encode()
    answer_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))

    class DeadlineProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _in_headers = False  # a request's first byte arrived, its headers are not complete

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers = True
            self._arm()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if self._in_headers or cycle is None:  # no request reached the app (or none began at all)
                if self._in_headers:
                    on_expired("header_timeout")
                    log.info("request headers did not arrive in time; connection closed",
                             extra={"event": "header_timeout", "timeout_s": timeout_s})
                    self.transport.write(answer_408)
                self.transport.close()
            elif cycle.response_complete:  # answered; the rest of its body never came
                on_expired("body_timeout")
                self.transport.close()
            else:
                cycle.keep_alive = False  # close once the app has answered (a 408 if it awaited the body)

    return DeadlineProtocol
