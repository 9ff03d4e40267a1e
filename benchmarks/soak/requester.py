"""One request to the gateway: a chat completion (aiohttp, or the official ``openai`` client), an outcome
report, or raw bytes on a fresh socket; each answer recorded (:class:`~benchmarks.soak.recorder.Recorder`)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import re
import time
from typing import Any

from benchmarks.soak.recorder import Recorder
from benchmarks.soak.traffic import tenant_key

# the tenant of the agent whose task sends a request (set once per agent task: see Agents.client)
TENANT: contextvars.ContextVar[int | None] = contextvars.ContextVar("soak_tenant", default=None)


def assemble_sse(raw: bytes) -> dict[str, Any] | None:
    """The assistant message of an SSE chat completion (content and tool calls merged by index)."""
    msg: dict[str, Any] = {}
    calls: dict[int, dict[str, Any]] = {}
    for line in raw.splitlines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        try:
            chunk = json.loads(data)
            delta = chunk["choices"][0]["delta"]
        except (ValueError, KeyError, IndexError, TypeError):
            continue
        if delta.get("role"):
            msg["role"] = delta["role"]
        if isinstance(delta.get("content"), str):
            msg["content"] = msg.get("content", "") + delta["content"]
        for c in delta.get("tool_calls") or []:
            acc = calls.setdefault(c.get("index", 0), {"id": "", "type": "function",
                                                       "function": {"name": "", "arguments": ""}})
            acc["id"] += c.get("id") or ""
            fn = c.get("function") or {}
            acc["function"]["name"] += fn.get("name") or ""
            acc["function"]["arguments"] += fn.get("arguments") or ""
    if not msg and not calls:
        return None
    out = {"role": "assistant", "content": msg.get("content") or None}
    if calls:
        out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


class Requester(Recorder):
    # ---- one chat request ------------------------------------------------------------------------
    def headers(self, kind: str, rid: str, want: str | None, final: bool, conv: str | None,
                outcome: str | None, *, first: bool = False, encoding: str | None = None,
                allowed: bool = False) -> dict[str, str]:
        tenant = TENANT.get()
        key = "soak-client-key" if tenant is None else tenant_key(tenant)
        h = {"content-type": "application/json", "authorization": f"Bearer {key}",
             "x-soak-id": rid, "x-soak-kind": kind, "x-soak-k": str(self.k)}
        if tenant is not None:
            h["x-soak-tenant"] = str(tenant)
        if first:
            h["x-soak-first"] = "1"
        if encoding:
            h["x-soak-encoding"] = encoding
        if allowed:
            h["x-soak-allowed"] = "1"
        if want:
            h["x-soak-want"] = want
        if final:
            h["x-soak-final"] = "1"
        if conv:
            h["x-tracer-conversation"] = conv
        if outcome:
            h["x-tracer-outcome"] = outcome
        return h

    async def chat(self, session, kind: str, messages: list[dict], tools: list[dict], *, stream: bool = False,
                   want: str | None = None, final: bool = False, conv: str | None = None,
                   outcome: str | None = None, sdk=None, first: bool = False, encoding: str | None = None,
                   tool_choice: dict | None = None, close_at_done: bool = False) -> dict[str, Any] | None:
        """Send one chat request; the reply's message, conversation id and extra headers, or None.

        ``encoding``: the stub compresses its answer so; ``close_at_done``: a stream is read up to its
        ``data: [DONE]`` line and the connection dropped right there."""
        import aiohttp

        rid = self.next_id()
        hdrs = self.headers(kind, rid, want, final, conv, outcome, first=first, encoding=encoding,
                            allowed=tool_choice is not None)
        body = {"model": "stub-model", "messages": messages, "tools": tools}
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        if stream:
            body["stream"] = True
        if sdk is not None:
            return await self.chat_sdk(sdk, kind, rid, body, hdrs)
        t0 = time.perf_counter()
        try:
            async with session.post(f"{self.gw}/v1/chat/completions", data=json.dumps(body).encode(),
                                    headers=hdrs) as r:
                if stream and close_at_done and r.status == 200:
                    lines = []
                    while True:
                        line = await asyncio.wait_for(r.content.readline(), 60)
                        lines.append(line)
                        if not line or line.strip() == b"data: [DONE]":
                            break
                    raw = b"".join(lines)
                    r.close()  # drop the connection at [DONE], before the body's end
                else:
                    raw = await r.read()
                status, rh = r.status, r.headers
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            self.record(kind, rid, None, type(e).__name__, detail=str(e))
            return None
        message = None
        if 200 <= status < 300:
            if stream:
                message = assemble_sse(raw)
            else:
                with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                    message = json.loads(raw)["choices"][0]["message"]
        ok_shape = kind == "odd_upstream" or isinstance(message, dict)
        sel = rh.get("x-tracer-selection-ms")
        self.record(kind, rid, status, n_tools=len(tools), sel_ms=float(sel) if sel else None,
                    latency_ms=(time.perf_counter() - t0) * 1e3, bad_reply=not ok_shape,
                    detail=raw[:300].decode("utf-8", "replace"))
        if not 200 <= status < 300:
            return None
        extra = {k.lower(): v for k, v in rh.items() if k.lower().startswith("x-tracer-")
                 and k.lower() not in ("x-tracer-conversation", "x-tracer-selection-ms")}
        for k in extra:
            self.extra_headers_seen[k] += 1
        return {"message": message if isinstance(message, dict) else None,
                "conversation": rh.get("x-tracer-conversation"), "extra": extra}

    async def chat_sdk(self, sdk, kind: str, rid: str, body: dict,
                       hdrs: dict[str, str]) -> dict[str, Any] | None:
        import openai

        extra_headers = {("Authorization" if k == "authorization" else k): v for k, v in hdrs.items()
                         if k != "content-type"}
        t0 = time.perf_counter()
        try:
            if body.get("stream"):  # the client reads the chunks up to [DONE] and closes the stream
                raw = await sdk.chat.completions.with_raw_response.create(
                    model=body["model"], messages=body["messages"], tools=body["tools"], stream=True,
                    extra_headers=extra_headers)
                stream = raw.parse()
                merged: dict[str, Any] = {"role": "assistant", "content": None}
                calls: dict[int, dict[str, Any]] = {}
                async with stream:
                    async for chunk in stream:
                        for choice in chunk.choices:
                            d = choice.delta
                            if d.content:
                                merged["content"] = (merged["content"] or "") + d.content
                            for c in d.tool_calls or []:
                                acc = calls.setdefault(c.index, {"id": "", "type": "function",
                                                                 "function": {"name": "", "arguments": ""}})
                                acc["id"] += c.id or ""
                                if c.function:
                                    acc["function"]["name"] += c.function.name or ""
                                    acc["function"]["arguments"] += c.function.arguments or ""
                if calls:
                    merged["tool_calls"] = [calls[i] for i in sorted(calls)]
                message = merged if (merged["content"] or calls) else None
            else:
                raw = await sdk.chat.completions.with_raw_response.create(
                    model=body["model"], messages=body["messages"], tools=body["tools"],
                    extra_headers=extra_headers)
                completion_ = raw.parse()
                message = completion_.choices[0].message.model_dump(exclude_none=True)
            status = raw.status_code
        except openai.APIStatusError as e:
            self.record(kind, rid, e.status_code, detail=str(e))
            return None
        except (openai.APIError, ValueError, IndexError, AttributeError) as e:
            self.record(kind, rid, None, type(e).__name__, detail=str(e))
            return None
        sel = raw.headers.get("x-tracer-selection-ms")
        self.record(kind, rid, status, n_tools=len(body["tools"]), sel_ms=float(sel) if sel else None,
                    latency_ms=(time.perf_counter() - t0) * 1e3, bad_reply=message is None)
        extra = {k.lower(): v for k, v in raw.headers.items() if k.lower().startswith("x-tracer-")
                 and k.lower() not in ("x-tracer-conversation", "x-tracer-selection-ms")}
        for k in extra:
            self.extra_headers_seen[k] += 1
        return {"message": message, "conversation": raw.headers.get("x-tracer-conversation"), "extra": extra}

    async def post_outcome(self, session, kind: str, payload: bytes, extra: dict[str, str]) -> int | None:
        """``POST /v1/tracer/outcome``; any credential the gateway handed out (an ``x-tracer-*`` answer header
        other than the conversation and the selection time) is sent back as a header."""
        import aiohttp

        rid = self.next_id()
        headers = {"content-type": "application/json", **extra}
        try:
            async with session.post(f"{self.gw}/v1/tracer/outcome", data=payload, headers=headers) as r:
                raw = await r.read()
                status = r.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            self.record(kind, rid, None, type(e).__name__, detail=str(e))
            return None
        self.record(kind, rid, status, detail=raw[:300].decode("utf-8", "replace"))
        return status

    async def raw(self, data: list[bytes], *, read: bool = True, abort: bool = False,
                  pause_after_first: float = 0.0) -> tuple[int | None, str | None]:
        """Send bytes on a fresh socket; the status line's code (or None) and an exception name."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.gw_port), 10)
        except (OSError, asyncio.TimeoutError) as e:
            return None, type(e).__name__
        reading = asyncio.ensure_future(asyncio.wait_for(reader.readline(), 30)) if read else None
        exc = None
        try:
            for i, part in enumerate(data):
                if reading is not None and reading.done():
                    break
                writer.write(part)
                await writer.drain()
                if i == 0 and pause_after_first and reading is not None:  # an answer before the body?
                    await asyncio.wait([reading], timeout=pause_after_first)
        except (OSError, asyncio.TimeoutError) as e:
            exc = type(e).__name__
        try:
            if abort or reading is None:
                return None, exc
            try:
                line = await reading
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                return None, exc or type(e).__name__
            m = re.match(rb"HTTP/1\.[01] (\d{3})", line)
            return (int(m.group(1)), None) if m else (None, exc or "no status line")
        finally:
            if reading is not None and not reading.done():
                reading.cancel()
            if abort:
                writer.transport.abort()
            else:
                writer.close()
                with contextlib.suppress(OSError, asyncio.TimeoutError):
                    await asyncio.wait_for(writer.wait_closed(), 5)

    @staticmethod
    def http(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
             length: int | None = None) -> bytes:
        h = {"Host": "127.0.0.1", "Authorization": "Bearer soak-client-key",
             "Content-Type": "application/json", "Connection": "close", **(headers or {})}
        if "Transfer-Encoding" not in h:
            h["Content-Length"] = str(len(body) if length is None else length)
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
        return head.encode("latin-1") + body
