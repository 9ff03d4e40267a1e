"""``tracer mcp`` on streamable HTTP: the SDK's session manager behind a gate that decides who opens a
session.

The SDK's ``StreamableHTTPSessionManager`` serves both protocol eras (handshake-era sessions, 2026-07-28
single requests) and caps its open sessions in all: past the cap a new one gets 503 until one ends. Left
to that cap, bare ``initialize`` POSTs that never DELETE would keep every client out until their idle
timeout (30 minutes by default). :class:`SessionGate`, in front of the manager:

- admits a new handshake-era session (a POST without ``Mcp-Session-Id`` and without a 2026-07-28 protocol
  header) after ending the pending sessions that must make room for it (:meth:`Sessions.to_make_room`):
  pending sessions never keep anyone out. It answers 503 only while ``max_sessions`` sessions are being
  opened at that very moment;
- records the session id the SDK answers with as pending (:meth:`Sessions.opened`);
- answers 404 to a request carrying a session id that another tenant opened, as the SDK does under its
  own auth (:mod:`tracer.serve.mcp.tenants`);
- forgets a session its client DELETEs;
- ends pending sessions past the handshake deadline (:meth:`SessionGate.sweep`), and the sessions the
  table drops (:meth:`SessionGate.end`), by sending the manager a DELETE for them: the protocol's own way
  to end a session, which the manager serves like a client's.

The SDK's own cap stays as a backstop at twice ``max_sessions`` (held and pending), under which the gate
keeps it.
"""

from __future__ import annotations

import contextlib
import logging

import anyio
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST, ErrorData, JSONRPCError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from tracer.serve.mcp.sessions import Sessions
from tracer.serve.mcp.tenants import Tenants

logger = logging.getLogger(__name__)

PATH = "/mcp"
SWEEP_S = 1.0  # how often pending sessions are checked against their deadline, at most


class SessionGate:
    """The ASGI app in front of the SDK's session manager (see the module docstring)."""

    def __init__(self, manager: StreamableHTTPSessionManager, sessions: Sessions, tenants: Tenants):
        self.manager, self.sessions, self.tenants = manager, sessions, tenants
        self._lock = anyio.Lock()
        self._opening = 0  # new sessions whose opening request is being served
        self._hosts: dict[str, bytes] = {}  # Host header each session was opened with (to end it alike)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.manager.handle_request(scope, receive, send)
            return
        headers = Headers(scope=scope)
        tenant = self.tenants.tenant_of(headers)
        session = headers.get(MCP_SESSION_ID_HEADER)
        if session is not None:
            owner = self.sessions.owner(session)
            if owner is not None and owner != tenant:
                logger.warning("refused a request for session %s: another credential opened it", session[:64])
                await _error("Session not found", 404, INVALID_REQUEST)(scope, receive, send)
                return
            status = await _served(self.manager.handle_request, scope, receive, send)
            if scope["method"] == "DELETE" and status == 200:
                self._forget(session)
            return
        version = headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if scope["method"] != "POST" or (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS):
            await self.manager.handle_request(scope, receive, send)  # no session opens here
            return
        await self._open(scope, receive, send, tenant, headers.get("host", ""))

    async def _open(self, scope: Scope, receive: Receive, send: Send, tenant: str, host: str) -> None:
        async with self._lock:
            for session in self.sessions.to_make_room(self._opening):
                await self.end(session)
            if self.sessions.pending() + self._opening >= self.sessions.caps.max_sessions:
                refusal = _error("Too many sessions opening at once; retry", 503, INTERNAL_ERROR)
                await refusal(scope, receive, send)
                return
            self._opening += 1

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                opened = Headers(raw=message.get("headers", [])).get(MCP_SESSION_ID_HEADER)
                if opened:
                    self._hosts[opened] = host.encode("latin-1")
                    self.sessions.opened(opened, tenant)
            await send(message)

        try:
            await self.manager.handle_request(scope, receive, watch)
        finally:
            self._opening -= 1

    def _forget(self, session: str) -> None:
        self._hosts.pop(session, None)
        self.sessions.forget_http(session)

    async def end(self, session: str) -> None:
        """End HTTP session ``session`` as its client's DELETE would (its next request gets 404)."""
        scope: Scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "DELETE",
            "scheme": "http", "path": PATH, "raw_path": PATH.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", self._hosts.get(session, b"")),
                        (MCP_SESSION_ID_HEADER.encode(), session.encode("latin-1"))],
            "client": None, "server": None}
        self._forget(session)
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if sent:
                await anyio.sleep_forever()
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}

        async def discard(_: Message) -> None:
            return None

        with anyio.CancelScope(shield=True):
            status = await _served(self.manager.handle_request, scope, receive, discard)
        logger.info("ended MCP session %s (%s)", session[:64], status)

    async def sweep(self) -> None:
        """End pending sessions past their handshake deadline, for as long as the server runs."""
        while True:
            await anyio.sleep(min(SWEEP_S, self.sessions.caps.handshake_s / 4))
            for session in self.sessions.expired_pending():
                await self.end(session)


def gated_app(manager: StreamableHTTPSessionManager, gate: SessionGate) -> Starlette:
    """The app serving ``gate`` at :data:`PATH`, running the manager and the gate's sweeper."""

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        async with manager.run(), anyio.create_task_group() as tasks:
            tasks.start_soon(gate.sweep)
            yield
            tasks.cancel_scope.cancel()

    return Starlette(routes=[Route(PATH, endpoint=gate)], lifespan=lifespan)


def _error(message: str, status: int, code: int) -> Response:
    body = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=code, message=message))
    return Response(body.model_dump_json(by_alias=True, exclude_unset=True), status_code=status,
                    media_type="application/json")


async def _served(app, scope: Scope, receive: Receive, send: Send) -> int | None:
    """Run ``app`` for one request; the HTTP status it answered with (None if it sent none)."""
    status = None

    async def watch(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    await app(scope, receive, watch)
    return status
