"""The gateway's own endpoints under ``/v1/tracer/`` and who may call them.

- ``POST /v1/tracer/outcome`` finishes a logged conversation with its outcome. Only the conversation's
  owner or an operator may: the request carries either ``X-Tracer-Outcome-Token``, the capability the
  gateway sends back with every answer of that conversation (:class:`OutcomeTokens`: the conversation's
  tenant, then an HMAC of its key under a key drawn at start-up, so it holds for this process's lifetime,
  as the pending conversations do), or the admin token, with the conversation's ``tenant`` in the body
  (the gateway's ``chat`` log lines carry it; without it, the anonymous tenant). The body is small
  (``max_body_bytes``, 16 KiB by default) and ``reward``, when given, a finite number.
- ``POST /v1/tracer/reload`` reloads the index now. Admin only: it is off unless the gateway was started
  with an admin token (``--admin-token`` or ``TRACER_ADMIN_TOKEN``), sent as ``Authorization: Bearer
  TOKEN``. Calls while a reload runs (whoever started it: the endpoint, the poll, SIGHUP) wait for it
  and get its result; the endpoint starts a reload at most once per ``reload_min_interval_s`` (429 with
  ``Retry-After`` before that): a full load and verification of an index costs seconds of CPU, and a
  flood of calls must not queue them.

Tokens are compared in constant time (:func:`hmac.compare_digest`).

**The admin surface is matched exactly and answered here.** Anything under ``/v1/tracer`` that is not one
of the routes above is a 404 (a known path with another method a 405) from the gateway itself: a
mistyped admin call (``GET /v1/tracer/reload``, ``/v1/tracer/relaod``, ``/v1/tracer/reload/``) is never
forwarded, so the admin token it carries never leaves the gateway (and :func:`tracer.serve.http.guards.
refuse_admin_token` refuses any forwarded request that carries it).

**``X-Tracer-Outcome`` on a chat request** (:func:`outcome_header`) is ``success`` or ``failure``; an
outcome that cannot be applied is not dropped silently: the answer says why in
``X-Tracer-Outcome-Ignored`` and ``tracer_outcome_ignored_total{reason}`` counts it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import math
import os
import re
import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tracer.serve.conversations import ConversationKey
from tracer.serve.http.validation import RequestError, check_conversation_id, openai_error
from tracer.serve.log.exchange import OutcomeGate

OUTCOME_TOKEN_HEADER = "x-tracer-outcome-token"
OUTCOME_IGNORED_HEADER = "x-tracer-outcome-ignored"
ROUTES = {"/v1/tracer/outcome": "POST", "/v1/tracer/reload": "POST"}  # the admin surface, path -> method
_TENANT = re.compile(r"[0-9a-f]{32}")


class OutcomeTokens:
    """Per-conversation capabilities: ``issue(key)`` goes out with each answer of the conversation ``key``
    (a :class:`ConversationKey`), :meth:`key` reads one back.

    A token is 64 hex digits: the conversation's tenant (32), then the first 128 bits of an HMAC-SHA256 of
    its key. It names its tenant, so its holder need not send the credential again to report an outcome,
    and it is good for that tenant's conversation of that id only."""

    def __init__(self, key: bytes | None = None):
        self._key = key or os.urandom(32)

    def issue(self, key: ConversationKey) -> str:
        mac = hmac.new(self._key, key.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        return key.tenant + mac[:32]

    def key(self, conversation: str, token: str | None) -> ConversationKey | None:
        """The conversation ``token`` is good for, if its id is ``conversation``; else None."""
        if token is None or not _TENANT.fullmatch(token[:32]):
            return None
        key = ConversationKey(token[:32], conversation)
        good = hmac.compare_digest(self.issue(key).encode(), token.encode("utf-8", "replace"))
        return key if good else None


# why an X-Tracer-Outcome was not applied: the label of tracer_outcome_ignored_total, then what the answer's
# X-Tracer-Outcome-Ignored says after it
IGNORED = {"invalid": "expected success or failure",
           "logging_off": "the gateway logs nothing (started without --log DIR)",
           "status": "an outcome applies to an answer sent whole, a 200"}


def outcome_header(value: str | None, logging: bool, status: int) -> tuple[bool | None, str | None]:
    """A chat request's ``X-Tracer-Outcome``: (success to apply or None, why it is ignored: a key of
    :data:`IGNORED`, or None).

    ``success`` and ``failure`` (any case, spaces around) apply to an answer of status 200 while logging
    is on; anything else is ignored, with a reason (the value itself is never echoed)."""
    if value is None:
        return None, None
    word = value.strip().lower()
    if word not in ("success", "failure"):
        return None, "invalid"
    if not logging:
        return None, "logging_off"
    if status != 200:
        return None, "status"
    return word == "success", None


class CoalescedReload:
    """One reload at a time: a call while one runs awaits that one and returns its result."""

    def __init__(self, reload: Callable[[bool], Awaitable[bool]]):
        self._reload = reload
        self._running: asyncio.Future[bool] | None = None

    async def __call__(self, force: bool) -> bool:
        if self._running is None:
            self._running = asyncio.ensure_future(self._reload(force))
            self._running.add_done_callback(self._done)
        return await asyncio.shield(self._running)  # a caller that gives up leaves the reload running

    def _done(self, future: asyncio.Future[bool]) -> None:
        self._running = None

    @property
    def running(self) -> bool:
        return self._running is not None


class Admin:
    """The handlers; see the module docstring.

    Args:
        token: the admin token (None: admin endpoints off).
        sink: the conversation log (None: logging off, outcomes are a 409).
        reload: the gateway's coalesced reload.
        reloads: how many reloads swapped the index so far (for the answer).
        read_body: the gateway's body reader with the admin endpoints' limit
            (:func:`tracer.serve.http.guards.read_body`: 413, 408, a hang-up counted).
        reload_min_interval_s: this endpoint starts a reload at most this often.
        anonymous: the anonymous tenant (:meth:`ConversationIds.tenant` of no credential), the tenant of
            an admin's outcome that names none.
    """

    def __init__(self, token: str | None, sink: OutcomeGate | None, reload: CoalescedReload,
                 reloads: Callable[[], int], read_body: Callable[[Request], Awaitable[bytes]],
                 reload_min_interval_s: float = 10.0, anonymous: str = "0" * 32):
        self._token = None if not token else token.encode()
        self.sink, self._reload, self._reloads, self._read_body = sink, reload, reloads, read_body
        self.reload_min_interval_s = reload_min_interval_s
        self._reload_started = -math.inf  # time.monotonic() when this endpoint last started a reload
        self.tokens = OutcomeTokens()
        self.anonymous = anonymous

    @property
    def token(self) -> bytes | None:
        """The admin token (None: admin endpoints off)."""
        return self._token

    def outcome_headers(self, key: ConversationKey) -> list[tuple[bytes, bytes]]:
        """The answer header carrying the conversation's outcome token (none when logging is off)."""
        if self.sink is None:
            return []
        return [(OUTCOME_TOKEN_HEADER.encode(), self.tokens.issue(key).encode())]

    async def unrouted(self, request: Request) -> Response:
        """Anything under ``/v1/tracer`` that is not an admin route: a 405 for a known path with another
        method, else a 404; answered here, never forwarded."""
        allowed = ROUTES.get(request.url.path)
        if allowed is not None:
            answer = openai_error(405, f"{request.method} {request.url.path}: only {allowed} is allowed",
                                  "invalid_request_error", "method")
            answer.headers["allow"] = allowed
            return answer
        return openai_error(404, f"no gateway endpoint {request.url.path[:200]!r} under /v1/tracer (the "
                                 f"gateway's own: {', '.join(f'{m} {p}' for p, m in ROUTES.items())}); "
                                 "it is not forwarded", "invalid_request_error", "path")

    def is_admin(self, request: Request) -> bool:
        scheme, _, sent = request.headers.get("authorization", "").partition(" ")
        return (self._token is not None and scheme.lower() == "bearer"
                and hmac.compare_digest(sent.strip().encode("utf-8", "surrogateescape"), self._token))

    async def reload(self, request: Request) -> Response:
        if self._token is None:
            return openai_error(403, "admin endpoints are off: start the gateway with --admin-token or "
                                     "TRACER_ADMIN_TOKEN", "permission_error")
        if not self.is_admin(request):
            return openai_error(403, "needs Authorization: Bearer <admin token>", "permission_error")
        if not self._reload.running:  # else: wait for the running reload and answer its result
            wait = self._reload_started + self.reload_min_interval_s - time.monotonic()
            if wait > 0:
                answer = openai_error(429, f"one reload per {self.reload_min_interval_s} s; "
                                           f"retry in {wait:.1f} s", "rate_limit_error")
                answer.headers["retry-after"] = str(math.ceil(wait))
                return answer
            self._reload_started = time.monotonic()
        return JSONResponse({"reloaded": await self._reload(True), "reloads": self._reloads()})

    async def outcome(self, request: Request) -> Response:
        try:
            body = _outcome_body(await self._read_body(request))
        except RequestError as e:
            return openai_error(e.status, str(e), "invalid_request_error", e.param)
        conversation = body["conversation"]
        if self.sink is None:
            return openai_error(409, "logging is off (start the gateway with --log DIR)",
                                "invalid_request_error")
        key = self.tokens.key(conversation, request.headers.get(OUTCOME_TOKEN_HEADER))
        if key is None and self.is_admin(request):
            key = ConversationKey(body.get("tenant") or self.anonymous, conversation)
        if key is None:
            return openai_error(403, "needs the conversation's X-Tracer-Outcome-Token (sent with each of its "
                                     "answers) or Authorization: Bearer <admin token>", "permission_error")
        found = self.sink.finish(key, body["success"], body.get("reward"))
        return JSONResponse({"conversation": conversation, "logged": found}, 200 if found else 404)


def _outcome_body(raw: bytes) -> dict:
    """``{"conversation": str, "success": bool, "reward": finite number (optional), "tenant": 32 hex digits
    (optional)}`` or RequestError."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise RequestError("body is not valid JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("conversation"), str):
        raise RequestError("must be a string", "conversation")
    check_conversation_id(body["conversation"], "conversation")
    tenant = body.get("tenant")
    if tenant is not None and not (isinstance(tenant, str) and _TENANT.fullmatch(tenant)):
        raise RequestError("must be a tenant: 32 lowercase hex digits (an outcome token's first 32, or the "
                           "tenant of the gateway's chat log lines)", "tenant")
    if not isinstance(body.get("success"), bool):
        raise RequestError("must be true or false", "success")
    reward = body.get("reward")
    if reward is not None and not _finite(reward):
        raise RequestError("must be a finite number (not NaN, Infinity or out of range)", "reward")
    return body


def _finite(x: object) -> bool:
    try:  # json reads NaN, Infinity and 1e999 (as inf); a huge integer overflows a float
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:
        return False
