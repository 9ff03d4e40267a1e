"""What the gateway refuses at its edge before anything is forwarded: a passthrough path that could
name something outside the upstream's ``/v1``, and a request body that is too large, too slow, or cut
off by the client.

uvicorn percent-decodes the path it hands the app (``/v1/..%2fadmin`` arrives as ``/v1/../admin``) and
the upstream client (yarl) resolves ``..`` segments, so a path such as ``/v1/%2e%2e/admin`` would reach
``{upstream}/admin`` carrying the client's ``Authorization``. The check runs on the path as the client
sent it (``raw_path``), segment by segment after decoding, and the path is forwarded as it was encoded,
never the decoded form (a decoded ``%3F`` would turn into a query).

The gateway's own secrets never travel upstream: ``/v1/tracer/...`` is the gateway's admin surface,
answered locally (:mod:`tracer.serve.http.admin`), and a path that reads as it once empty segments are dropped
and case is folded (``/v1//tracer/reload``, ``/v1/Tracer/reload``) is refused here rather than forwarded;
a request that carries the admin token in any header is never forwarded (:func:`refuse_admin_token`).
"""

from __future__ import annotations

import asyncio
import hmac
from urllib.parse import unquote

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from tracer.serve.http.validation import RequestError, openai_error

_PREFIX = "/v1/"
_ADMIN = "tracer"  # /v1/tracer/...: the gateway's own endpoints
_BAD_IN_SEGMENT = ("/", "\\", "\x00")


def passthrough_path(raw_path: bytes) -> str:
    """The path below the upstream's base URL to forward (``/models/m``), as the client encoded it.

    Raises :class:`RequestError` (400, ``param="path"``) when a segment decodes to ``.`` or ``..`` or
    holds an (encoded) slash, a backslash or NUL, or when the raw path does not start with ``/v1/``.
    """
    path = raw_path.decode("latin-1")
    if not path.startswith(_PREFIX):
        raise RequestError("must start with /v1/ as sent, not percent-encoded", "path")
    rest = path[len(_PREFIX) - 1:]
    decoded = [unquote(segment, errors="replace") for segment in rest.split("/")[1:]]
    for segment in decoded:
        if segment in (".", "..") or any(c in segment for c in _BAD_IN_SEGMENT):
            raise RequestError("segments '.' and '..', encoded slashes, backslashes and NUL are refused",
                               "path")
    if [s.casefold() for s in decoded if s][:1] == [_ADMIN]:
        raise RequestError("/v1/tracer/... is the gateway's own admin surface (POST /v1/tracer/outcome, "
                           "POST /v1/tracer/reload); it is never forwarded", "path", status=404)
    return rest


def refusal(e: RequestError) -> JSONResponse:
    """The OpenAI-shaped answer to a refused request (a 403 is a ``permission_error``)."""
    return openai_error(e.status, str(e), "permission_error" if e.status == 403 else "invalid_request_error",
                        e.param)


def refuse_admin_token(headers: list[tuple[bytes, bytes]], token: bytes | None) -> None:
    """:class:`RequestError` (403) if a header of a request to forward (ASGI's raw pairs; ``x-tracer-*``
    are never forwarded) carries the admin ``token``: as its whole value, what follows its scheme
    (``Bearer TOKEN``), or a whitespace- or comma-separated word of it. The gateway's own secret never
    reaches the upstream, whatever the path. Each candidate is compared in constant time."""
    if token is None:
        return
    for name, value in headers:
        if name.startswith(b"x-tracer-"):
            continue
        words = [value.strip(), value.strip().partition(b" ")[2].strip(), *value.replace(b",", b" ").split()]
        for word in words:
            if hmac.compare_digest(word, token):
                raise RequestError("the gateway's admin token is never forwarded to the upstream; send the "
                                   "upstream's own credential", "authorization", status=403)


class ClientGone(RequestError):
    """The client closed its connection before its request body arrived (status 499, as nginx logs it:
    no answer can reach it)."""

    def __init__(self) -> None:
        super().__init__("the client closed the connection before its request body arrived", status=499)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, or :class:`RequestError`: 413 over ``limit`` bytes (refused from its declared
    length before reading when it has one), 408 when it has not arrived within ``timeout_s``, and
    :class:`ClientGone` when the client hangs up first."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"request body of {declared} bytes is over the limit of {limit}", status=413)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestError(f"request body is over the limit of {limit} bytes", status=413)
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(f"the request body did not arrive within {timeout_s} s", status=408) from None
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)
