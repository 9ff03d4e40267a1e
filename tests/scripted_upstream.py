"""An OpenAI-compatible upstream for the gateway's logging tests that streams and compresses as real servers
do: a Starlette app served on loopback (:func:`gateway_harness.serving`).

``POST /v1/chat/completions`` answers an agent's script by the number of tool results in the history: none,
a call of ``get_weather``; one, a call of ``send_email``; more, the text ``"Done."``. With ``"stream": true``
the message goes out as ``chat.completion.chunk`` events (role, content, each tool call in two argument
fragments, the finish reason, a usage-only chunk) and ``data: [DONE]``, one write per event; ``tail_s`` keeps
the body open that long after ``[DONE]`` before it ends (a server whose chunked body ends in a later write
than its last event).

``encoding`` (``"gzip"`` or ``"deflate"``): the answer is compressed with it when the request's
``Accept-Encoding`` names it (the official ``openai`` client sends ``gzip, deflate``), sent with
``Content-Encoding``; a stream is compressed as one body, each event flushed (``Z_SYNC_FLUSH``) so a client
decodes it as it arrives. ``sent`` holds the exact body bytes of every answer, as they went on the wire.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

HEAD = {"id": "chatcmpl-scripted", "created": 1700000000, "model": "m"}
WBITS = {"gzip": 31, "deflate": 15}  # zlib's container for each Content-Encoding


def scripted_message(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The agent script's next assistant message for ``messages``."""
    done = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")
    if done >= 2:
        return {"role": "assistant", "content": "Done."}
    name, args = [("get_weather", '{"city": "Paris"}'),
                  ("send_email", '{"to": "bob", "body": "sunny"}')][done]
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{done}", "type": "function",
                            "function": {"name": name, "arguments": args}}]}


def completion(message: dict[str, Any]) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {**HEAD, "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}}


def sse_events(message: dict[str, Any]) -> list[bytes]:
    """``message`` as the events of a streamed completion, ``data: [DONE]`` last."""
    head = {**HEAD, "object": "chat.completion.chunk"}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for i, call in enumerate(message.get("tool_calls") or []):
        name, args = call["function"]["name"], call["function"]["arguments"]
        deltas.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                       "function": {"name": name, "arguments": args[:7]}}]})
        deltas.append({"tool_calls": [{"index": i, "function": {"arguments": args[7:]}}]})
    chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append({**head, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7,
                                                     "total_tokens": 16}})
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


class ScriptedUpstream:
    """See the module docstring; :attr:`app` is the ASGI app, :attr:`sent` the answers' body bytes."""

    def __init__(self, encoding: str | None = None, tail_s: float = 0.0):
        self.encoding, self.tail_s = encoding, tail_s
        self.sent: list[bytes] = []
        self.requests: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.completions, methods=["POST"])])

    async def completions(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append(body)
        message = scripted_message(body["messages"])
        accepted = {e.strip().split(";")[0] for e in request.headers.get("accept-encoding", "").split(",")}
        encoding = self.encoding if self.encoding in accepted else None
        headers = {"content-encoding": encoding} if encoding else {}
        if not body.get("stream"):
            data = json.dumps(completion(message)).encode()
            if encoding:
                packer = zlib.compressobj(wbits=WBITS[encoding])
                data = packer.compress(data) + packer.flush()
            self.sent.append(data)
            return Response(data, headers=headers, media_type="application/json")
        sent = bytearray()
        self.sent.append(sent)  # filled as the stream goes out
        packer = zlib.compressobj(wbits=WBITS[encoding]) if encoding else None

        async def events():
            for event in sse_events(message):
                out = packer.compress(event) + packer.flush(zlib.Z_SYNC_FLUSH) if packer else event
                sent.extend(out)
                yield out
                await asyncio.sleep(0.002)
            if self.tail_s:
                await asyncio.sleep(self.tail_s)
            if packer:
                out = packer.flush()
                sent.extend(out)
                yield out
        return StreamingResponse(events(), headers=headers, media_type="text/event-stream")
