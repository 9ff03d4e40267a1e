"""An executor for any OpenAI-compatible chat-completions endpoint, over the standard library's HTTP client.

The client POSTs ``{base_url}/chat/completions`` with the conversation, the presented tools (best
first, as OpenAI tool objects) and ``tool_choice``, and reads the first choice's first tool call.
There is no dependency on the ``openai`` package.

A local model speaks this protocol through vLLM's server, with a tool-call parser that matches
the model's chat template::

    vllm serve Qwen/Qwen2.5-7B-Instruct --enable-auto-tool-choice --tool-call-parser hermes
    vllm serve meta-llama/Llama-3.1-8B-Instruct --enable-auto-tool-choice --tool-call-parser llama3_json
    vllm serve mistralai/Mistral-7B-Instruct-v0.3 --enable-auto-tool-choice --tool-call-parser mistral

and then ``executor=openai executor.base_url=http://127.0.0.1:8000/v1 executor.model=<the served name>``.
Without ``--enable-auto-tool-choice`` the server rejects ``tool_choice: auto`` with a 400, which is
not retried. A local server needs no key: when the ``api_key_env`` variable is unset no
``Authorization`` header is sent.

Decisions:
    * the first tool call of the first choice is the decision; further calls are counted in
      ``raw["n_tool_calls"]`` and otherwise ignored;
    * arguments that are not a JSON object -> ``Decision(call=None, malformed=True)``, with the
      name and the raw argument text kept in ``raw``; empty arguments (``""`` or null) are ``{}``;
    * a call naming a tool that was not presented is still a call (the backend will reject it in
      free-running); it is flagged ``raw["not_presented"] = True``;
    * connection errors, timeouts, HTTP 429 and 5xx are retried with exponential back-off
      (``backoff_s * 2**k``, or the server's ``Retry-After`` when that is longer); other 4xx are
      not retried. A request that still fails is ``Decision(call=None, error=...)``.

Counters (thread-safe, cumulative over the executor's life): ``n_requests`` (logical requests:
decisions and completions, not HTTP attempts), ``n_retries`` (extra attempts), ``n_errors``
(requests that ended in an error), ``n_malformed``, ``prompt_tokens`` and ``completion_tokens``
(summed from the server's ``usage``).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..types import ToolCall
from .base import Decision, Request

RETRY_AFTER_CAP_S = 60.0  # never sleep longer than this on a server's Retry-After


class ExecutorError(RuntimeError):
    """A request to the model server failed for good (after retries, or with a non-retryable status)."""


class OpenAIExecutor:
    """Chat-completions client with tool calling, retries and a concurrency limit.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: the model name the server expects.
        api_key_env: environment variable holding the API key (unset or empty: no auth header).
        tool_choice: sent as is (``"auto"``, ``"required"``, ``"none"`` or a named-function object).
        temperature, max_tokens: sampling settings sent with every request.
        timeout_s: socket timeout of one HTTP attempt.
        max_retries: retries after the first attempt (so at most ``max_retries + 1`` attempts).
        concurrency: how many requests :meth:`choose` keeps in flight at once.
        backoff_s: first retry delay; doubles at each retry.
        extra_body: extra JSON fields merged into every request body last (e.g. ``seed``,
            ``top_p``, vLLM's ``chat_template_kwargs``); they override the fields above.
    """

    name = "openai"
    is_oracle = False

    def __init__(self, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 tool_choice: Any = "auto", temperature: float = 0.0, max_tokens: int = 512,
                 timeout_s: float = 60, max_retries: int = 4, concurrency: int = 8, backoff_s: float = 0.5,
                 extra_body: Mapping[str, Any] | None = None, **_: Any):
        if not base_url or not model:
            raise ValueError("OpenAIExecutor needs base_url and model (e.g. executor.model=Qwen/Qwen2.5-7B-Instruct)")
        if concurrency < 1 or max_retries < 0:
            raise ValueError(f"need concurrency >= 1 and max_retries >= 0, got {concurrency} and {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.tool_choice = tool_choice
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.backoff_s = backoff_s
        self.extra_body = dict(extra_body or {})
        self.tokenizer_name = f"server:{model}"  # prompt tokens are the server's own count (usage)
        api_key = os.environ.get(api_key_env) if api_key_env else None
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._opener = urllib.request.build_opener()  # honours the *_proxy / no_proxy environment
        self._lock = threading.Lock()
        self.n_requests = self.n_retries = self.n_errors = self.n_malformed = 0
        self.prompt_tokens = self.completion_tokens = 0

    def __repr__(self) -> str:
        return f"OpenAIExecutor(model={self.model!r}, url={self.url!r})"

    # -- the Executor protocol -------------------------------------------------------------------

    def choose(self, requests: Sequence[Request]) -> list[Decision]:
        """One decision per request, in order; up to ``concurrency`` requests in flight at once."""
        requests = list(requests)
        if len(requests) <= 1 or self.concurrency == 1:
            return [self._choose_one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests)),
                                thread_name_prefix="tracer-openai") as pool:
            return list(pool.map(self._choose_one, requests))  # map keeps the input order

    def complete(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Free text for ``messages`` (no tools). Raises :class:`ExecutorError` when the request fails."""
        body, error = self._post(self._payload(messages, ()))
        if error is None:
            try:
                message = body["choices"][0]["message"]
            except (KeyError, IndexError, TypeError):
                error = f"response from {self.url} has no choices[0].message: {_clip(body)}"
        if error is not None:
            self._count(n_errors=1)
            raise ExecutorError(error)
        self._count_usage(body)
        return message.get("content") or ""

    # -- one request -----------------------------------------------------------------------------

    def _payload(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> dict:
        payload: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages]}
        if tools:
            payload["tools"] = [dict(t) for t in tools]
            payload["tool_choice"] = self.tool_choice
        payload["temperature"] = self.temperature
        payload["max_tokens"] = self.max_tokens
        payload.update(self.extra_body)
        return payload

    def _choose_one(self, request: Request) -> Decision:
        body, error = self._post(self._payload(request.messages, request.tools))
        if error is not None:
            self._count(n_errors=1)
            return Decision(call=None, error=error)
        return self._decision(body, request.tools)

    def _decision(self, body: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]) -> Decision:
        prompt_tokens, completion_tokens = self._count_usage(body)
        choices = body.get("choices") or []
        if not choices or not isinstance(choices[0], Mapping):
            self._count(n_errors=1)
            return Decision(call=None, error=f"response from {self.url} has no choices: {_clip(body)}")
        choice = choices[0]
        message = choice.get("message") or {}
        text = message.get("content") or ""
        raw: dict[str, Any] = {"finish_reason": choice.get("finish_reason")}
        if message.get("reasoning_content"):  # vLLM reasoning parsers put the thinking here
            raw["reasoning"] = message["reasoning_content"]
        tool_calls = message.get("tool_calls") or []
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        if not tool_calls:
            return Decision(call=None, text=text, raw=raw, **usage)

        raw["n_tool_calls"] = len(tool_calls)
        first = tool_calls[0] if isinstance(tool_calls[0], Mapping) else {}
        function = first.get("function") or {}
        name, arguments = function.get("name"), function.get("arguments")
        parsed = _parse_arguments(arguments)
        if not isinstance(name, str) or not name or parsed is None:
            self._count(n_malformed=1)
            raw.update(name=name, arguments=arguments)
            return Decision(call=None, text=text, malformed=True, raw=raw, **usage)
        if name not in {t["function"]["name"] for t in tools}:
            raw["not_presented"] = True
        call = ToolCall(name=name, arguments=parsed, id=str(first.get("id") or ""))
        return Decision(call=call, text=text, raw=raw, **usage)

    def _post(self, payload: Mapping[str, Any]) -> tuple[dict | None, str | None]:
        """POST with retries. Returns ``(body, None)`` or ``(None, error text)``."""
        self._count(n_requests=1)
        data = json.dumps(payload).encode("utf-8")
        last = ""
        for attempt in range(self.max_retries + 1):
            retry_after = 0.0
            try:
                http_request = urllib.request.Request(self.url, data=data, headers=self._headers, method="POST")
                with self._opener.open(http_request, timeout=self.timeout_s) as response:
                    raw = response.read()
            except urllib.error.HTTPError as e:  # a status >= 400; must come before URLError/OSError
                last = f"HTTP {e.code} from {self.url}: {_error_detail(e)}"
                if e.code != 429 and e.code < 500:
                    return None, last
                retry_after = _retry_after(e.headers)
            except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out, cut short
                last = f"{type(e).__name__} talking to {self.url}: {getattr(e, 'reason', None) or e}"
            else:
                try:
                    body = json.loads(raw)
                except ValueError:
                    return None, f"invalid JSON from {self.url}: {_clip(raw)}"
                if not isinstance(body, dict):
                    return None, f"unexpected response from {self.url}: {_clip(body)}"
                return body, None
            if attempt < self.max_retries:
                self._count(n_retries=1)
                time.sleep(max(self.backoff_s * 2**attempt, retry_after))
        return None, f"gave up after {self.max_retries + 1} attempts: {last}"

    # -- counters --------------------------------------------------------------------------------

    def _count(self, **increments: int) -> None:
        with self._lock:
            for key, value in increments.items():
                setattr(self, key, getattr(self, key) + value)

    def _count_usage(self, body: Mapping[str, Any]) -> tuple[int | None, int | None]:
        usage = body.get("usage") or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        prompt = prompt if isinstance(prompt, int) else None
        completion = completion if isinstance(completion, int) else None
        self._count(prompt_tokens=prompt or 0, completion_tokens=completion or 0)
        return prompt, completion

    @property
    def counters(self) -> dict[str, int]:
        """A snapshot of the counters, for logging."""
        keys = ("n_requests", "n_retries", "n_errors", "n_malformed", "prompt_tokens", "completion_tokens")
        with self._lock:
            return {k: getattr(self, k) for k in keys}


def _parse_arguments(arguments: Any) -> dict | None:
    """The arguments of a tool call as a dict, or None when they are not a JSON object."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, Mapping):  # some servers send an object instead of a JSON string
        return dict(arguments)
    if not isinstance(arguments, str):
        return None
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _error_detail(e: urllib.error.HTTPError) -> str:
    """The server's error message (OpenAI's ``{"error": {"message": ...}}``, else the body's start)."""
    try:
        raw = e.read()
    except (OSError, http.client.HTTPException):
        return e.reason or ""
    try:
        body = json.loads(raw)
        err = body.get("error", body) if isinstance(body, dict) else body
        message = err.get("message") if isinstance(err, dict) else err
        if message:
            return str(message)[:500]
    except ValueError:
        pass
    return _clip(raw) or str(e.reason or "")


def _retry_after(headers: Any) -> float:
    try:
        return min(max(float(headers.get("Retry-After") or 0), 0.0), RETRY_AFTER_CAP_S)
    except (TypeError, ValueError):  # an HTTP date, or garbage: fall back to our own back-off
        return 0.0


def _clip(obj: Any, n: int = 300) -> str:
    text = obj.decode("utf-8", "replace") if isinstance(obj, bytes) else str(obj)
    return text if len(text) <= n else text[:n] + "..."
