"""The OpenAI-compatible tool-filtering gateway (``tracer serve``), a Starlette app.

``POST /v1/chat/completions``: the request carries its full ``tools`` and ``messages``; the gateway
chooses k tools (:mod:`tracer.serve.selection`), forwards the request with only those to
``{upstream}/chat/completions`` (headers, ``Authorization`` included, passed through) and returns the
upstream's answer unchanged: status, headers and body bytes, streamed chunk by chunk when the upstream
streams (SSE). Requests with at most k tools, and any other ``/v1/...`` path, are forwarded as they
came. Each answer carries ``X-Tracer-Conversation`` (the id to report an outcome under),
``X-Tracer-Selection-Ms`` (the time spent choosing, also in ``tracer_selection_seconds``) and
``X-Tracer-Index`` (the snapshot that chose, ``snapshots/<id>``: which index answered, behind a load
balancer).

Errors of our own are OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``): 400 naming
the field of a malformed request, 413 over the size limit, 502 when the upstream cannot be reached, 504
past the upstream deadline. A failure of the selection itself forwards the request with all its tools
(fail open) and counts ``tracer_errors{kind="selection"}``.

Also: ``GET /health``, ``GET /metrics`` (Prometheus), ``POST /v1/tracer/outcome`` and ``POST
/v1/tracer/reload`` (who may call them: :mod:`tracer.serve.http.admin`); anything else under ``/v1/tracer`` is
answered here (404/405), never forwarded.

Per-conversation state (the sticky list, the pending log, the outcome token) is kept per tenant, the
request's credential (:mod:`tracer.serve.conversations`): two keys sending one ``X-Tracer-Conversation``
share nothing.

**Trial conversations** (:mod:`tracer.scorer_base.trial`). With ``--log``, a conversation whose id (the one
the client knows: its ``X-Tracer-Conversation``, or the id continuation gave it) the serving index draws as a
trial (:meth:`Retriever.is_trial`) is shown the other ranking's top k after the served k at each step
(:mod:`tracer.serve.selection`, "Trial steps"), and its log record says so (:mod:`tracer.serve.log.sink`), so
``tracer update --refit`` judges the two rankings on those steps. Without ``--log`` no conversation is a
trial: a trial costs prompt tokens, and only a logged one teaches anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import Counter
from dataclasses import dataclass

import aiohttp
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tracer.serve.bounded import safe_url
from tracer.serve.conversations import ConversationIds, credential_of, reply_message
from tracer.serve.http.admin import IGNORED, OUTCOME_IGNORED_HEADER, Admin, CoalescedReload, outcome_header
from tracer.serve.http.guards import ClientGone, passthrough_path, read_body, refusal, refuse_admin_token
from tracer.serve.http.held import IndexTools, candidates
from tracer.serve.http.metrics import GatewayMetrics, Stopwatch
from tracer.serve.http.offload import SelectionStage
from tracer.serve.http.status import CountStatus
from tracer.serve.http.upstream import Upstream, answer_headers, chunks, forwarded_headers, read_all
from tracer.serve.http.validation import (
    RequestError,
    check_conversation_id,
    dump_body,
    openai_error,
    parse_chat_request,
)
from tracer.serve.log.exchange import OutcomeGate, log_exchange
from tracer.serve.log.sink import ConversationLog
from tracer.serve.reload import IndexHolder, refreeze_long_lived
from tracer.serve.selection import StickyPresenter, UnknownToolVectors, forwarded_body

log = logging.getLogger("tracer.serve")
ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@dataclass
class GatewayConfig:
    """Args:
        upstream: the upstream's OpenAI base URL (``http://host:port/v1``).
        k: tools presented per request.
        sticky: prompt-cache-stable presentation (see :class:`StickyPresenter`).
        max_presented: cap on a conversation's sticky list (None: 4 k).
        max_body_bytes: request-size limit.
        upstream_timeout_s: deadline of one upstream request (to its last byte when not streamed, to each
            chunk when streamed).
        reload_interval_s: how often the index directory's version token is checked (0: never).
        log_idle_s: a logged conversation idle this long is finished as unreported.
        read_timeout_s: a request's headers, and then its body, must arrive within this.
        admin_token: enables the admin endpoints (None: off); see :mod:`tracer.serve.http.admin`.
        max_admin_body_bytes: body limit of ``/v1/tracer/*``.
        reload_min_interval_s: ``POST /v1/tracer/reload`` starts a reload at most this often.
        max_unknown_embed: new texts of tools the index does not know embedded per request at most.
        tools_from_index: the registry is held here (:mod:`tracer.serve.http.held`): a request's ``tools``
            are only its own additions, the candidates are the index's tools plus those.
    """

    upstream: str
    k: int = 5
    sticky: bool = True
    max_presented: int | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    upstream_timeout_s: float = 300.0
    reload_interval_s: float = 2.0
    log_idle_s: float = 600.0
    read_timeout_s: float = 30.0
    admin_token: str | None = None
    max_admin_body_bytes: int = 16 * 1024
    reload_min_interval_s: float = 10.0
    max_unknown_embed: int = 256
    tools_from_index: bool = False


class Gateway:
    """The gateway's state and handlers; :attr:`app` is the ASGI app."""

    def __init__(self, holder: IndexHolder, config: GatewayConfig, sink: ConversationLog | None = None):
        self.holder, self.config, self.sink = holder, config, sink
        self.metrics = GatewayMetrics()
        if sink is not None:
            self.metrics.watch_log(sink.stats)
        presenter = StickyPresenter(config.sticky, config.max_presented or 4 * config.k)
        unknown = UnknownToolVectors(max_new=config.max_unknown_embed)
        self.selection = SelectionStage(config.k, presenter, unknown, self.metrics)
        self.index_tools = IndexTools()  # the registry as OpenAI objects, for tools_from_index
        self.conversations = ConversationIds()
        self.upstream = Upstream(config.upstream, config.upstream_timeout_s)
        self._reload = CoalescedReload(self._load_fresh)  # SIGHUP, the poll and the endpoint share one
        self.gate = None if sink is None else OutcomeGate(sink)  # outcomes wait for a stream going out
        self.admin = Admin(config.admin_token, self.gate, self._reload, lambda: self.holder.reloads,
                           lambda r: self._read_body(r, config.max_admin_body_bytes),
                           config.reload_min_interval_s, self.conversations.tenant(None))
        self.app = Starlette(routes=[
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.render_metrics, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/tracer/outcome", self.admin.outcome, methods=["POST"]),
            Route("/v1/tracer/reload", self.admin.reload, methods=["POST"]),
            Route("/v1/tracer", self.admin.unrouted, methods=ANY_METHOD),  # answered here, never forwarded
            Route("/v1/tracer/{rest:path}", self.admin.unrouted, methods=ANY_METHOD),
            Route("/v1/{path:path}", self.passthrough, methods=["GET", "POST", "DELETE"]),
        ], lifespan=self._lifespan, middleware=[Middleware(CountStatus, counter=self.metrics.requests)])

    # ---- lifecycle -------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        self.upstream.start()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not in the main thread
            loop.add_signal_handler(signal.SIGHUP, self._reload_soon, True)
        tasks = [asyncio.create_task(self._housekeeping())]
        log.info("gateway started", extra={"event": "started", "upstream": safe_url(self.config.upstream),
                                           "k": self.config.k, "index": str(self.holder.directory),
                                           "sticky": self.config.sticky})
        try:
            yield
        finally:  # uvicorn has stopped taking requests and drained those in flight
            for t in tasks:
                t.cancel()
            await self.upstream.close()
            if self.sink is not None:
                await asyncio.to_thread(self.sink.close)
            log.info("gateway stopped", extra={"event": "stopped"})

    async def _housekeeping(self) -> None:
        interval = self.config.reload_interval_s
        while True:
            await asyncio.sleep(interval if interval > 0 else 5.0)
            if interval > 0:
                await self._reload(False)
            if self.sink is not None:
                self.sink.sweep()

    def _reload_soon(self, force: bool) -> None:
        asyncio.get_running_loop().create_task(self._reload(force))

    async def _load_fresh(self, force: bool) -> bool:
        failed = self.holder.failed_loads
        swapped = await asyncio.get_running_loop().run_in_executor(None, self.holder.maybe_reload, force)
        self.metrics.errors.labels("reload_failed").inc(self.holder.failed_loads - failed)
        if swapped:
            self.metrics.reloads.inc()
            refreeze_long_lived()
        return swapped

    # ---- small endpoints ---------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """200 even when degraded (:meth:`IndexHolder.health`)."""
        return JSONResponse({**self.holder.health(),
                             "conversations_logged": None if self.sink is None else self.sink.written})

    async def render_metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    # ---- chat completions ----------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        try:
            refuse_admin_token(request.headers.raw, self.admin.token)
            raw = await self._read_body(request)
            body, names = parse_chat_request(raw, lenient := Counter())
            header = check_conversation_id(request.headers.get("x-tracer-conversation"),
                                           "X-Tracer-Conversation")
        except RequestError as e:
            return refusal(e)
        for kind, n in lenient.items():  # what the body's reading forgave (validation.py)
            self.metrics.lenient.labels(kind).inc(n)
        messages, tools = body["messages"], body.get("tools") or []
        turn = self.conversations.assign(messages, credential_of(request.headers), header)
        conv = turn.key  # what per-conversation state is kept under: the tenant and the id
        self.metrics.conversations.labels(turn.how).inc()
        retriever, version = self.holder.served  # one index for the whole request, named in its answer
        trial = self.sink is not None and retriever.is_trial(turn.id)  # only a logged trial teaches
        own = tools
        if self.config.tools_from_index and body.get("tool_choice") != "none":  # the registry is held here
            tools, names = candidates(*self.index_tools.of(retriever), tools, names)
            body = {**body, "tools": tools}
            raw = dump_body(body) if len(tools) <= self.config.k else raw
        presented, selection_s = names, 0.0
        if len(tools) > self.config.k:
            try:
                with Stopwatch() as stage:
                    presented = await self.selection(retriever, conv, body, names, trial)
                selection_s = stage.seconds
                raw = dump_body(forwarded_body(body, names, presented))  # allowed_tools narrowed to them
            except Exception:
                self.metrics.errors.labels("selection").inc()
                log.exception("selection failed; forwarding every tool", extra={"event": "selection_failed",
                                                                                  "conversation": conv})
                presented = names
                raw = dump_body(body) if own is not tools else raw
        if own is not tools:  # the log needs what was offered: the presented schemas and the request's own
            shown = set(presented)
            body = {**body, "tools": [t for t, n in zip(tools, names) if n in shown] + list(own)}
        extra = [(b"x-tracer-conversation", turn.id.encode("latin-1")),
                 (b"x-tracer-selection-ms", f"{selection_s * 1e3:.3f}".encode()),
                 *([(b"x-tracer-index", version.encode())] if version else []),
                 *self.admin.outcome_headers(conv)]
        response = await self._forward(request, "/chat/completions", raw, bool(body.get("stream")), extra)
        self.conversations.answered(turn, reply_message(response))
        outcome = self._outcome(request.headers.get("x-tracer-outcome"), response)
        if self.sink is not None:
            self._observe(conv, body, presented, response, outcome, trial)
        if log.isEnabledFor(logging.INFO):
            log.info("chat", extra={"event": "chat", "conversation": turn.id, "tenant": conv.tenant,
                                    "status": response.status_code,
                                    "tools_in": len(tools), "presented": len(presented), "trial": trial,
                                    "selection_ms": round(selection_s * 1e3, 3)})
        return response

    async def passthrough(self, request: Request) -> Response:
        try:
            path = passthrough_path(request.scope["raw_path"])
            refuse_admin_token(request.headers.raw, self.admin.token)
            raw = await self._read_body(request) if request.method == "POST" else b""
        except RequestError as e:
            return refusal(e)
        return await self._forward(request, path, raw, False, [])

    async def _read_body(self, request: Request, limit: int | None = None) -> bytes:
        try:
            return await read_body(request, limit or self.config.max_body_bytes, self.config.read_timeout_s)
        except RequestError as e:  # a client that hung up or stalled: counted and logged, no traceback
            if e.status in (408, 499):
                kind = "client_disconnect" if isinstance(e, ClientGone) else "body_timeout"
                self.metrics.errors.labels(kind).inc()
                log.info(str(e), extra={"event": kind, "path": request.url.path})
            raise

    async def _forward(self, request: Request, path: str, raw: bytes, stream: bool,
                       extra: list[tuple[bytes, bytes]]) -> Response:
        query = request.scope["query_string"]
        if query:
            path += "?" + query.decode("latin-1")
        try:
            with Stopwatch() as sw:
                resp = await self.upstream.open(request.method, path, forwarded_headers(request.headers.raw),
                                                raw)
        except TimeoutError:
            return self._fail(504, "upstream_timeout", f"the upstream did not answer within "
                                                       f"{self.config.upstream_timeout_s} s")
        except aiohttp.ClientError as e:
            return self._fail(502, "upstream_unreachable", "cannot reach the upstream", repr(e))
        self.metrics.upstream.observe(sw.seconds)
        headers = answer_headers(resp) + extra
        if stream:
            answer = StreamingResponse(chunks(resp), resp.status)
        else:
            try:
                answer = Response(await read_all(resp), resp.status)
            except TimeoutError:
                return self._fail(504, "upstream_timeout", "the upstream's answer did not finish in time")
        answer.raw_headers = headers + answer.raw_headers  # Response's own: content-length of what we send
        return answer

    def _fail(self, status: int, kind: str, message: str, detail: str | None = None) -> Response:
        """The client gets ``message``; ``detail`` (an internal address, say) goes only to the log."""
        self.metrics.errors.labels(kind).inc()
        log.warning(message, extra={"event": kind, "error": detail})
        return openai_error(status, message, kind)

    def _outcome(self, value: str | None, response: Response) -> str | None:
        """The ``X-Tracer-Outcome`` to apply (``success``/``failure``) or None; one that cannot apply is
        named in the answer's ``X-Tracer-Outcome-Ignored`` and counted (:func:`.admin.outcome_header`)."""
        success, ignored = outcome_header(value, self.sink is not None, response.status_code)
        if ignored is not None:
            self.metrics.outcome_ignored.labels(ignored).inc()
            why = f"{ignored}: {IGNORED[ignored]}"
            response.raw_headers.append((OUTCOME_IGNORED_HEADER.encode(), why.encode()))
        return None if success is None else "success" if success else "failure"

    def _observe(self, conv: str, body: dict, presented: list[str], response: Response,
                 outcome: str | None, trial: bool) -> None:
        """Log the exchange (``trial``: a step of a trial conversation); the outcome header applies only to an
        answer sent whole (:mod:`tracer.serve.log.exchange`)."""
        log_exchange(self.gate, conv, body, presented, response, outcome, self.config.max_body_bytes, trial)
