"""What the gateway refuses at its edge before anything is forwarded: a passthrough path that could
name something outside the upstream's ``/v1``, and a request body that is too large, too slow, or cut
off by the client.

uvicorn percent-decodes the path it hands the app (``/v1/..%2fadmin`` arrives as ``/v1/../admin``) and
the upstream client (yarl) resolves ``..`` segments, so a path such as ``/v1/%2e%2e/admin`` would reach
``{upstream}/admin`` carrying the client's ``Authorization``. The check runs on the path as the client
sent it (``raw_path``), segment by segment after decoding, and the path is forwarded as it was encoded,
never the decoded form (a decoded ``%3F`` would turn into a query).
"""

from __future__ import annotations

import asyncio
from urllib.parse import unquote

from starlette.requests import ClientDisconnect, Request

from tracer.serve.validation import RequestError

_PREFIX = "/v1/"
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
    for segment in rest.split("/")[1:]:
        decoded = unquote(segment, errors="replace")
        if decoded in (".", "..") or any(c in decoded for c in _BAD_IN_SEGMENT):
            raise RequestError("segments '.' and '..', encoded slashes, backslashes and NUL are refused",
                               "path")
    return rest


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
