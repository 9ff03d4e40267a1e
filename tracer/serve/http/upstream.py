"""The gateway's HTTP client to the upstream (aiohttp).

aiohttp rather than httpx: with 16 requests in flight, forwarding one 68 KB request through
``httpx.AsyncClient`` cost more CPU than everything else the gateway does (its connection pool scans
every connection for each request, and each request passes its auth, redirect and cookie layers);
aiohttp's client, with its C HTTP parser, does the same hop for a fraction of it (docs/gateway.md,
Latency). What the gateway needs of the client, all kept:

- connections are reused, and an idle one is dropped after ``keepalive_s`` (before a server's usual
  5 s keep-alive ends it under us);
- a deadline: the response's headers within ``timeout_s`` of sending, and then each read of its body
  within ``timeout_s`` (a stream may last long, each chunk may not wait longer);
- **no retry of a request that may have reached the upstream.** A chat completion is not idempotent: an
  upstream that read it and then closed the connection may have run it (and billed it), so sending it again
  could run it twice. The gateway retries nothing itself; aiohttp's own rule (RFC 9112, 9.3.1.1) is the
  whole policy: a connection that cannot be opened fails before any byte is sent (a 502, the client may
  retry), and a kept-alive connection found closed is retried once on a fresh one only for an idempotent
  method (``GET``, ``DELETE``, ...), never for ``POST``. The race between reusing an idle connection and
  the server closing it is made rare instead: idle connections are dropped after ``keepalive_s``, well
  before a server's usual 5 s keep-alive ends them;
- bytes pass through as they are: no decompression, no header added that the caller did not send
  beyond ``Host``, ``Content-Length`` and aiohttp's defaults for ``Accept``, ``Accept-Encoding`` and
  ``User-Agent`` when the caller sent none;
- credentials in the base URL (``http://user:password@host/v1``) are the gateway's own: they are kept
  apart from :attr:`Upstream.base_url` (which is then safe to show) and sent as HTTP Basic auth in place
  of the caller's ``Authorization`` (one request cannot carry both).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
from yarl import URL

# hop-by-hop headers (RFC 9110 7.6.1) and those the proxy recomputes
_DROP_REQUEST = frozenset((b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding",
                           b"upgrade", b"te", b"proxy-connection"))
_DROP_RESPONSE = frozenset((b"content-length", b"connection", b"keep-alive", b"transfer-encoding",
                            b"upgrade"))


def forwarded_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The request headers to pass on (ASGI's lowercased raw pairs): hop-by-hop and ``x-tracer-*`` dropped."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw
            if k not in _DROP_REQUEST and not k.startswith(b"x-tracer-")]


def answer_headers(response: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    """The upstream answer's headers to return (lowercased raw pairs, hop-by-hop dropped)."""
    return [(k.lower(), v) for k, v in response.raw_headers if k.lower() not in _DROP_RESPONSE]


class Upstream:
    """A pooled client to one upstream base URL; :meth:`start` inside the running event loop.

    Args:
        base_url: the upstream's OpenAI base URL (``http://host:port/v1``).
        timeout_s: the deadline (see the module docstring).
        keepalive_s: how long an idle connection is kept.
    """

    def __init__(self, base_url: str, timeout_s: float, keepalive_s: float = 2.0):
        url = URL(base_url)
        auth = aiohttp.BasicAuth.from_url(url)
        self.auth_header = None if auth is None else auth.encode()  # "Basic <base64 user:password>"
        self.base_url = str(url.with_user(None)).rstrip("/")
        self.timeout_s, self.keepalive_s = timeout_s, keepalive_s
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout_s, sock_read=self.timeout_s)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=self.keepalive_s),
            timeout=timeout, auto_decompress=False, skip_auto_headers=("Content-Type",),
            cookie_jar=aiohttp.DummyCookieJar())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def open(self, method: str, path: str, headers: list[tuple[str, str]],
                   body: bytes) -> aiohttp.ClientResponse:
        """Send; the response once its headers arrived (read its body, then release it).

        Raises ``TimeoutError`` past the deadline and :class:`aiohttp.ClientError` when the upstream
        cannot be reached.
        """
        assert self._session is not None, "Upstream.start() was not called"
        url = self.base_url + path
        try:
            return await asyncio.wait_for(self._send(method, url, headers, body), self.timeout_s)
        except asyncio.TimeoutError as e:  # aiohttp's own timeouts subclass it too
            raise TimeoutError(str(e)) from e

    async def _send(self, method: str, url: str, headers: list[tuple[str, str]],
                    body: bytes) -> aiohttp.ClientResponse:
        data = body or None
        if self.auth_header is not None:
            headers = [(k, v) for k, v in headers if k.lower() != "authorization"]
            headers.append(("Authorization", self.auth_header))
        # sent once: aiohttp retries a dropped kept-alive connection only for idempotent methods
        return await self._session.request(method, url, headers=headers, data=data, allow_redirects=False)


async def read_all(response: aiohttp.ClientResponse) -> bytes:
    """The whole body (each read within the deadline; ``TimeoutError`` past it); the connection is
    released."""
    try:
        return await response.read()
    except asyncio.TimeoutError as e:
        raise TimeoutError(str(e)) from e
    finally:
        response.release()


async def chunks(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body chunk by chunk as it arrives (SSE passes through unbuffered); released at the end or on
    exit."""
    try:
        async for chunk in response.content.iter_any():
            yield chunk
    finally:
        response.release()
