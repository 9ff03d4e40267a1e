"""Whom an MCP request of ``tracer mcp`` belongs to: its tenant and its session (docs/gateway.md, "Tenants").

Every piece of per-conversation state (a session's activity, its presented tools, its listen streams) is
owned by one session, and every session by one tenant:

- The **tenant** is a keyed digest of the request's ``Authorization`` header where one is sent (the key is
  random per process, so the credential itself is never kept; ``tracer mcp`` does not check credentials, it
  keeps one credential's sessions apart from another's). Requests over HTTP without one are the tenant
  ``anonymous``; stdio and in-process connections are the tenant ``local``.
- The **session**, by transport and protocol era:

  * streamable HTTP, handshake era (``initialize``): the ``Mcp-Session-Id``, within the tenant that sends
    it (the same id under another credential is another session, and :mod:`tracer.serve.mcp.http` answers
    it 404 as the SDK does with its own auth);
  * streamable HTTP, 2026-07-28 (no session on the wire): for a credentialed tenant, the session named by
    ``_meta["io.tracer/session"]``, ``default`` when none is named; a request without a credential has no
    session to belong to, so it is served from an activity of its own that no later request sees
    (:data:`None` here);
  * stdio and in process: the connection. The SDK enters the server's lifespan once per connection on these
    transports (and once for the whole streamable-HTTP manager), so the lifespan's object,
    :class:`LocalConnection`, is the connection's identity, and leaving the lifespan ends its session.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

ANONYMOUS = "anonymous"  # HTTP requests without a credential
LOCAL = "local"  # stdio and in-process connections
SESSION_META = "io.tracer/session"  # a 2026-07-28 request's session name within its tenant
MAX_SESSION_NAME = 128


@dataclass(frozen=True)
class SessionKey:
    """One session: its tenant, its name within the tenant, and the ``Mcp-Session-Id`` carrying it (a
    handshake-era HTTP session, which ends with it)."""

    tenant: str
    name: str
    http_session: str | None = None


@dataclass(eq=False)
class LocalConnection:
    """The lifespan object of one stdio or in-process connection: its identity."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)


class Tenants:
    """Tenants and session keys of requests, as the module docstring says."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)  # digests mean nothing outside this process

    def tenant_of(self, headers: Mapping[str, str]) -> str:
        """The tenant of an HTTP request: its credential's keyed digest, else :data:`ANONYMOUS`."""
        credential = headers.get("authorization")
        if not credential:
            return ANONYMOUS
        digest = hashlib.blake2b(credential.encode("utf-8", "surrogateescape"), key=self._key, digest_size=16)
        return "credential:" + digest.hexdigest()

    def key_of(self, ctx) -> SessionKey | None:
        """The session of a request (``ctx``: the SDK's ``ServerRequestContext``); None for a 2026-07-28
        request without a credential, which has none."""
        request = ctx.request
        if request is None:  # stdio, in process
            connection = ctx.lifespan_context
            if not isinstance(connection, LocalConnection):
                raise TypeError("tracer mcp's server must run with ToolRouter's lifespan")
            return SessionKey(LOCAL, connection.id)
        tenant = self.tenant_of(request.headers)
        http_session = request.headers.get("mcp-session-id")
        if http_session:
            return SessionKey(tenant, http_session, http_session)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and tenant != ANONYMOUS:
            return SessionKey(tenant, session_name(ctx.meta))
        return None


def session_name(meta: Mapping[str, object] | None) -> str:
    """``_meta["io.tracer/session"]``, checked (an INVALID_PARAMS error names the field), or ``default``."""
    name = (meta or {}).get(SESSION_META)
    if name is None:
        return "default"
    if not isinstance(name, str) or not 0 < len(name) <= MAX_SESSION_NAME:
        raise MCPError(INVALID_PARAMS, f'_meta["{SESSION_META}"] must be a string of 1 to {MAX_SESSION_NAME} '
                                       f"characters, got {type(name).__name__} "
                                       f"{str(name)[:MAX_SESSION_NAME]!r}")
    return name
