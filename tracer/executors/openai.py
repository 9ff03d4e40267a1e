"""An executor for any OpenAI-compatible chat-completions endpoint, over ``httpx``.

The client POSTs ``{base_url}/chat/completions`` with the conversation, the presented tools (best
first, as OpenAI tool objects) and ``tool_choice``, and reads the first choice's first tool call.
There is no dependency on the ``openai`` package: what we need from it (a deadline over the whole
request, a cap on the reply's size, a strict check of the reply's shape) it does not do.

A local model speaks this protocol through vLLM's server, with a tool-call parser that matches
the model's chat template::

    vllm serve Qwen/Qwen2.5-7B-Instruct --enable-auto-tool-choice --tool-call-parser hermes
    vllm serve meta-llama/Llama-3.1-8B-Instruct --enable-auto-tool-choice --tool-call-parser llama3_json
    vllm serve mistralai/Mistral-7B-Instruct-v0.3 --enable-auto-tool-choice --tool-call-parser mistral

and then ``executor=openai executor.base_url=http://127.0.0.1:8000/v1 executor.model=<the served name>``.
Without ``--enable-auto-tool-choice`` the server rejects ``tool_choice: auto`` with a 400, which is
not retried. A local server needs no key: when the ``api_key_env`` variable is unset no
``Authorization`` header is sent.

Each HTTP attempt has one deadline, ``timeout_s``, over connecting, sending and reading the whole
reply (a server that drips bytes is cut at the deadline, not kept alive by each byte), and a reply
longer than ``max_response_bytes`` is dropped as it arrives. Requests run on one asyncio event
loop per :meth:`OpenAIExecutor.choose`, at most ``concurrency`` in flight.

Decisions:
    * the reply must have the shape of a chat completion (:class:`Completion`, checked strictly:
      ``message`` an object, ``tool_calls`` a list of objects, ``function`` an object, ``usage``
      non-negative integers); any other shape is ``Decision(call=None, error=...)``, one counted
      error for that step, never an exception;
    * the first tool call of the first choice is the decision; further calls are counted in
      ``raw["n_tool_calls"]`` and otherwise ignored;
    * a call without a name, or whose arguments are not a JSON object -> ``Decision(call=None,
      malformed=True)``, with the name and the raw argument text kept in ``raw``; empty arguments
      (``""`` or null) are ``{}``;
    * ``calls_in_text=True``: a reply without ``tool_calls`` whose text holds calls (Qwen's
      ``<tool_call>{...}</tool_call>``, a bare JSON object, ...: read by
      :func:`tracer.executors.vllm.parse_tool_calls`) is taken as if the server had parsed them
      (``raw["calls_in_text"] = True``), for a server without a tool-call parser such as
      llama_cpp.server on a model's own chat template (docs/evaluation.md, "A local model"); text that
      tries a call and fails to parse is malformed;
    * a call naming a tool that was not presented is still a call (the evaluation counts it as an
      unpresented call, never a correct selection); it is flagged ``raw["not_presented"] = True``;
    * connection errors, deadline overruns, HTTP 429 and 5xx are retried (by tenacity) with exponential
      back-off (``backoff_s * 2**k``: :func:`tracer.core.backoff.backoff_s`, or the server's
      ``Retry-After`` when that is longer); other 4xx, an oversized reply and a wrong-shaped one are
      not. A request that still fails is ``Decision(call=None, error=...)``.
    * every decision carries ``seconds``, the request's wall time (a local server that answers one
      request at a time, as llama_cpp.server does, needs ``concurrency=1`` for it to be a step's own).

Counters (thread-safe, cumulative over the executor's life): ``n_requests`` (logical requests: decisions and
completions, not HTTP attempts), ``n_retries`` (extra attempts), ``n_errors`` (requests that ended in an
error), ``n_malformed``, ``prompt_tokens`` and ``completion_tokens`` (summed from the server's ``usage``)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from tracer.core.backoff import backoff_s
from tracer.core.types import ToolCall
from tracer.executors.base import Decision, Request
from tracer.executors.completion_schema import Completion, ValidationError, describe_error
from tracer.executors.openai_reply import _causes, _clip, _error_detail, _parse_arguments, _retry_after
from tracer.executors.vllm import split_tool_calls


class ExecutorError(RuntimeError):
    """A request to the model server failed for good (after retries, or with a non-retryable status)."""


class _Retryable(Exception):
    """One attempt failed in a way worth another try (``retry_after``: the server's wish, in seconds)."""

    def __init__(self, message: str, retry_after: float = 0.0):
        super().__init__(message)
        self.retry_after = retry_after


class OpenAIExecutor:
    """Chat-completions client with tool calling, a deadline per attempt, retries and a concurrency limit.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: the model name the server expects.
        api_key_env: environment variable holding the API key (unset or empty: no auth header).
        tool_choice: sent as is (``"auto"``, ``"required"``, ``"none"`` or a named-function object).
        temperature, max_tokens: sampling settings sent with every request.
        timeout_s: deadline of one HTTP attempt, from connecting to the reply's last byte.
        max_retries: retries after the first attempt (so at most ``max_retries + 1`` attempts).
        concurrency: how many requests :meth:`choose` keeps in flight at once.
        backoff_s: first retry delay; doubles at each retry.
        max_response_bytes: a longer reply is an error (not retried).
        extra_body: extra JSON fields merged into every request body last (e.g. ``seed``,
            ``top_p``, vLLM's ``chat_template_kwargs``); they override the fields above.
        calls_in_text: read calls written in the reply's text when it carries no ``tool_calls``.
    """

    name = "openai"
    is_oracle = False

    def __init__(self, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 tool_choice: Any = "auto", temperature: float = 0.0, max_tokens: int = 512,
                 timeout_s: float = 60, max_retries: int = 4, concurrency: int = 8, backoff_s: float = 0.5,
                 max_response_bytes: int = 8_000_000, extra_body: Mapping[str, Any] | None = None,
                 calls_in_text: bool = False, **_: Any):
        if not base_url or not model:
            raise ValueError("OpenAIExecutor needs base_url and model "
                             "(e.g. executor.model=Qwen/Qwen2.5-7B-Instruct)")
        if concurrency < 1 or max_retries < 0:
            raise ValueError(f"need concurrency >= 1 and max_retries >= 0, "
                             f"got {concurrency} and {max_retries}")
        if not timeout_s > 0 or max_response_bytes < 1:
            raise ValueError(f"need timeout_s > 0 and max_response_bytes >= 1, "
                             f"got {timeout_s} and {max_response_bytes}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.tool_choice = tool_choice
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.backoff_s = backoff_s
        self.max_response_bytes = max_response_bytes
        self.extra_body = dict(extra_body or {})
        self.calls_in_text = calls_in_text
        self.tokenizer_name = f"server:{model}"  # prompt tokens are the server's own count (usage)
        api_key = os.environ.get(api_key_env) if api_key_env else None
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._lock = threading.Lock()
        self.n_requests = self.n_retries = self.n_errors = self.n_malformed = 0
        self.prompt_tokens = self.completion_tokens = 0

    def __repr__(self) -> str:
        return f"OpenAIExecutor(model={self.model!r}, url={self.url!r})"

    # -- the Executor protocol -------------------------------------------------------------------

    def choose(self, requests: Sequence[Request]) -> list[Decision]:
        """One decision per request, in order; up to ``concurrency`` requests in flight at once."""
        requests = list(requests)
        return asyncio.run(self._gather([self._payload(r.messages, r.tools) for r in requests],
                                        [r.tools for r in requests])) if requests else []

    def complete(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Free text for ``messages`` (no tools). Raises :class:`ExecutorError` when the request fails."""
        [d] = asyncio.run(self._gather([self._payload(messages, ())], [()]))
        if d.error is not None:
            raise ExecutorError(d.error)
        return d.text

    # -- requests --------------------------------------------------------------------------------

    def _payload(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> dict:
        payload: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages]}
        if tools:
            payload["tools"] = [dict(t) for t in tools]
            payload["tool_choice"] = self.tool_choice
        payload["temperature"] = self.temperature
        payload["max_tokens"] = self.max_tokens
        payload.update(self.extra_body)
        return payload

    async def _gather(self, payloads: Sequence[dict],
                      tools: Sequence[Sequence[Mapping[str, Any]]]) -> list[Decision]:
        limit = asyncio.Semaphore(self.concurrency)
        # the deadline is ours (asyncio.timeout); httpx's own timeouts only back it up
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers,
                                     limits=httpx.Limits(max_connections=self.concurrency)) as http:
            async def one(payload: dict, presented: Sequence[Mapping[str, Any]]) -> Decision:
                async with limit:
                    start = time.perf_counter()  # once a slot is free: the server's time, not our queue's
                    body, error = await self._post(http, payload)
                    seconds = round(time.perf_counter() - start, 4)
                if error is not None:
                    self._count(n_errors=1)
                    return Decision(call=None, error=error, seconds=seconds)
                return replace(self._decision(body, presented), seconds=seconds)

            return list(await asyncio.gather(*(one(p, t) for p, t in zip(payloads, tools))))

    async def _post(self, http: httpx.AsyncClient,
                    payload: Mapping[str, Any]) -> tuple[bytes | None, str | None]:
        """POST with retries (which, how many and how long apart: the module docstring). Returns ``(raw
        reply, None)`` or ``(None, error text)``."""
        self._count(n_requests=1)
        data = json.dumps(payload).encode("utf-8")
        retrying = AsyncRetrying(stop=stop_after_attempt(self.max_retries + 1),
                                 retry=retry_if_exception_type(_Retryable), wait=self._wait,
                                 before_sleep=lambda _: self._count(n_retries=1), reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    reply = await self._attempt_in_time(http, data)
        except _Retryable as e:
            return None, f"gave up after {self.max_retries + 1} attempts: {e}"
        except ExecutorError as e:  # not worth another try
            return None, str(e)
        return reply, None

    def _wait(self, state: RetryCallState) -> float:
        """Seconds before retry ``state.attempt_number``: ``backoff_s * 2**(n - 1)``, or the server's
        ``Retry-After`` when that is longer."""
        return max(backoff_s(self.backoff_s, state.attempt_number), state.outcome.exception().retry_after)

    async def _attempt_in_time(self, http: httpx.AsyncClient, data: bytes) -> bytes:
        """:meth:`_attempt` within ``timeout_s``; running out of time or a failed connection is retryable."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._attempt(http, data)
        except TimeoutError:
            raise _Retryable(f"no complete reply from {self.url} within {self.timeout_s:g} s") from None
        except httpx.TransportError as e:  # refused, reset, cut short
            raise _Retryable(f"{type(e).__name__} talking to {self.url}: {_causes(e)}") from e

    async def _attempt(self, http: httpx.AsyncClient, data: bytes) -> bytes:
        """One HTTP attempt: the reply's bytes, read up to ``max_response_bytes``."""
        async with http.stream("POST", self.url, content=data) as response:
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > self.max_response_bytes:
                raise ExecutorError(f"reply from {self.url} is {declared} bytes, over max_response_bytes="
                                    f"{self.max_response_bytes}")
            raw = bytearray()
            async for chunk in response.aiter_bytes():
                raw += chunk
                if len(raw) > self.max_response_bytes:
                    raise ExecutorError(f"reply from {self.url} is over "
                                        f"max_response_bytes={self.max_response_bytes}")
        if response.status_code >= 400:
            detail = (f"HTTP {response.status_code} from {self.url}: "
                      f"{_error_detail(bytes(raw), response.reason_phrase)}")
            if response.status_code == 429 or response.status_code >= 500:
                raise _Retryable(detail, _retry_after(response.headers))
            raise ExecutorError(detail)
        return bytes(raw)

    # -- the reply -------------------------------------------------------------------------------

    def _decision(self, raw: bytes, tools: Sequence[Mapping[str, Any]]) -> Decision:
        try:
            reply = Completion.model_validate_json(raw)
        except ValidationError as e:
            self._count(n_errors=1)
            what = ("invalid JSON" if any(err["type"] == "json_invalid" for err in e.errors())
                    else "wrong shape")
            return Decision(call=None,
                            error=f"{what} in reply from {self.url}: {describe_error(e)} ({_clip(raw)})")
        usage = {"prompt_tokens": reply.usage.prompt_tokens if reply.usage else None,
                 "completion_tokens": reply.usage.completion_tokens if reply.usage else None}
        self._count(prompt_tokens=usage["prompt_tokens"] or 0,
                    completion_tokens=usage["completion_tokens"] or 0)
        choice = reply.choices[0]
        message = choice.message
        text = message.content or ""
        out: dict[str, Any] = {"finish_reason": choice.finish_reason}
        if message.reasoning_content:
            out["reasoning"] = message.reasoning_content
        if not message.tool_calls:
            if self.calls_in_text and text:
                return self._decision_from_text(text, tools, out, usage)
            return Decision(call=None, text=text, raw=out, **usage)
        out["n_tool_calls"] = len(message.tool_calls)
        first = message.tool_calls[0]
        name, arguments = first.function.name, first.function.arguments
        parsed = _parse_arguments(arguments)
        if not name or parsed is None:
            self._count(n_malformed=1)
            out.update(name=name, arguments=arguments)
            return Decision(call=None, text=text, malformed=True, raw=out, **usage)
        if name not in {t["function"]["name"] for t in tools}:
            out["not_presented"] = True
        return Decision(call=ToolCall(name=name, arguments=parsed, id=first.id or ""), text=text, raw=out,
                        **usage)

    def _decision_from_text(self, text: str, tools: Sequence[Mapping[str, Any]], out: dict[str, Any],
                            usage: dict[str, int | None]) -> Decision:
        calls, malformed, content = split_tool_calls(text)
        if not calls:
            if malformed:
                self._count(n_malformed=1)
            return Decision(call=None, text=text, malformed=malformed, raw=out, **usage)
        out.update(calls_in_text=True, n_tool_calls=len(calls))
        if calls[0].name not in {t["function"]["name"] for t in tools}:
            out["not_presented"] = True
        # the text before the call, as a server's tool-call parser returns it beside tool_calls: a loop that
        # carries the call forward as tool_calls would otherwise show the model its call twice
        return Decision(call=calls[0], text=content or None, raw=out, **usage)

    # -- counters --------------------------------------------------------------------------------

    def _count(self, **increments: int) -> None:
        with self._lock:
            for key, value in increments.items():
                setattr(self, key, getattr(self, key) + value)

    @property
    def counters(self) -> dict[str, int]:
        """A snapshot of the counters, for logging."""
        keys = ("n_requests", "n_retries", "n_errors", "n_malformed", "prompt_tokens", "completion_tokens")
        with self._lock:
            return {k: getattr(self, k) for k in keys}
