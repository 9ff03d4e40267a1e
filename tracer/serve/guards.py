"""What the gateway refuses at its edge before anything is forwarded: a passthrough path that could
name something outside the upstream's ``/v1``.

uvicorn percent-decodes the path it hands the app (``/v1/..%2fadmin`` arrives as ``/v1/../admin``) and
the upstream client (yarl) resolves ``..`` segments, so a path such as ``/v1/%2e%2e/admin`` would reach
``{upstream}/admin`` carrying the client's ``Authorization``. The check runs on the path as the client
sent it (``raw_path``), segment by segment after decoding, and the path is forwarded as it was encoded,
never the decoded form (a decoded ``%3F`` would turn into a query).
"""

from __future__ import annotations

from urllib.parse import unquote

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
            raise RequestError("segments '.' and '..', encoded slashes, backslashes and NUL are refused", "path")
    return rest
