"""The stub upstream (``--role stub``): a Starlette app that answers chat completions (JSON or SSE) with a
call of the tool the agent wants when it was presented, records the tools each request carried, and answers
``odd_upstream`` requests with shapes the gateway must pass through."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections import Counter
from typing import Any


def completion(message: dict[str, Any], rid: str) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def odd_answer(rid: str) -> dict[str, Any]:
    """Shapes a real upstream has been seen to send, which the gateway must pass through."""
    base = completion({"role": "assistant", "content": "ok"}, rid)
    shape = int(hashlib.sha256(rid.encode()).hexdigest(), 16) % 6
    if shape == 0:
        base["choices"][0]["message"] = "a plain string"
    elif shape == 1:
        base["choices"][0]["message"] = 5
    elif shape == 2:
        base["choices"] = []
    elif shape == 3:
        del base["choices"]
    elif shape == 4:
        base["choices"][0]["message"] = None
    else:  # arguments as an object instead of a JSON string
        base["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{rid}", "type": "function", "function": {"name": "x", "arguments": {"a": 1}}}]}
    return base


def sse_events(message: dict[str, Any], rid: str, pieces: int) -> list[bytes]:
    """The message as chat.completion.chunk events (tool call arguments or text cut into ``pieces``)."""
    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": 0, "model": "stub",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    def cut(text: str) -> list[str]:
        step = max(1, math.ceil(len(text) / pieces))
        return [text[i:i + step] for i in range(0, len(text), step)] or [""]

    out = [event({"role": "assistant", "content": None if message.get("tool_calls") else ""})]
    for call in message.get("tool_calls") or []:
        out.append(event({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        out += [event({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
                for part in cut(call["function"]["arguments"])]
    if message.get("content"):
        out += [event({"content": part}) for part in cut(message["content"])]
    out.append(event({}, "tool_calls" if message.get("tool_calls") else "stop"))
    out.append(b"data: [DONE]\n\n")
    return out


def stub_app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    records: dict[str, list] = {}   # request id -> [tools received, wanted tool among them]
    outside: list[str] = []         # raw paths that reached the stub outside /v1/
    by_kind: Counter[str] = Counter()

    async def completions(request):
        raw = await request.body()
        h = request.headers
        rid, kind, want = h.get("x-soak-id", ""), h.get("x-soak-kind", ""), h.get("x-soak-want")
        by_kind[kind] += 1
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        tools = body.get("tools") if isinstance(body, dict) else None
        names = [t["function"]["name"] for t in tools or [] if isinstance(t, dict)
                 and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)]
        if rid and len(records) < 5_000_000:
            records[rid] = [len(names), (want in names) if want else None]
        if kind == "cut_wait":
            await asyncio.sleep(2.0)
        if kind == "odd_upstream":
            return JSONResponse(odd_answer(rid))
        if h.get("x-soak-final") == "1" or not names:
            message: dict[str, Any] = {"role": "assistant",
                                       "content": "Done: everything you asked is finished."}
        else:  # the tool the agent wants when it was presented, else the first presented: deterministic
            name = want if want in names else names[0]
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{rid}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps({"id": rid, "note": "soak"})}}]}
        if isinstance(body, dict) and body.get("stream"):
            slow = kind == "cut_stream"
            if slow:
                message = {"role": "assistant", "content": "A long answer, sent slowly. " * 4}
            events = sse_events(message, rid, 12 if slow else 3)

            async def gen():
                for e in events:
                    yield e
                    await asyncio.sleep(0.15 if slow else 0.002)
            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse(completion(message, rid))

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def soak_records(request):
        return JSONResponse({"records": records, "outside": outside[:1000], "outside_count": len(outside),
                             "by_kind": by_kind})

    async def other(request):
        raw = request.scope.get("raw_path") or request.scope["path"].encode()
        path = raw.decode("latin-1")
        if not path.startswith("/v1/"):
            outside.append(path)
        return JSONResponse({"error": {"message": "not found", "type": "not_found"}}, 404)

    return Starlette(routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/soak/records", soak_records, methods=["GET"]),
        Route("/{path:path}", other, methods=["GET", "POST", "DELETE", "PUT", "PATCH"]),
    ])
