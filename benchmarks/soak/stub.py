"""The stub upstream (``--role stub``): a Starlette app that answers chat completions (JSON or SSE, plain or
compressed with gzip or deflate as the client's ``x-soak-encoding`` asks) with a call of the tool the agent
wants when it was presented, records the tools each request carried and how many times each request id
reached it (a second POST of one id is a duplicate upstream request), checks each request's presented tools
against its tenant (a first request of a conversation presented more than k tools: a sticky list from
elsewhere; an ``allowed_tools`` request presented a tool outside its allowed set), and answers
``odd_upstream`` requests with shapes the gateway must pass through."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import math
import zlib
from collections import Counter
from typing import Any

from benchmarks.soak.traffic import COMPANIES, family, known_tools


def compressor(encoding: str | None):
    """A zlib compressor for ``gzip`` or ``deflate`` (zlib-wrapped, as HTTP's deflate is), else None."""
    if encoding == "gzip":
        return zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS)
    return None


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
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    records: dict[str, list] = {}   # request id -> [tools received, wanted tool among them, POSTs]
    outside: list[str] = []         # raw paths that reached the stub outside /v1/
    by_kind: Counter[str] = Counter()
    encodings: Counter[str] = Counter()
    known = {t["function"]["name"] for t in known_tools()}
    allowed_of = {t: known | {f["function"]["name"] for f in family(t)} for t in range(len(COMPANIES))}
    tenancy: dict[str, Any] = {"duplicates": [], "first_requests": 0, "first_over_k": 0, "later_over_k": 0,
                               "first_over_k_samples": [], "allowed_requests": 0, "allowed_violations": 0,
                               "allowed_samples": [], "foreign_presented": 0, "by_tenant": Counter()}

    def sample(key: str, item: dict) -> None:
        if len(tenancy[key]) < 20:
            tenancy[key].append(item)

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
        if rid and rid in records:
            records[rid][2] += 1
            sample("duplicates", {"id": rid, "kind": kind, "posts": records[rid][2]})
        elif rid and len(records) < 5_000_000:
            records[rid] = [len(names), (want in names) if want else None, 1]
        tenant = int(h["x-soak-tenant"]) if h.get("x-soak-tenant", "").isdigit() else None
        if tenant is not None and tenant < len(COMPANIES):
            tenancy["by_tenant"][str(tenant)] += 1
            own = f"{COMPANIES[tenant]}_"
            tenancy["foreign_presented"] += sum(1 for n in names if any(
                n.startswith(f"{co}_") for co in COMPANIES) and not n.startswith(own))
            over_k = h.get("x-soak-k", "").isdigit() and len(names) > int(h["x-soak-k"])
            if h.get("x-soak-first") != "1":
                tenancy["later_over_k"] += over_k  # a sticky list grew: what a leaked one shows on a first
            else:
                tenancy["first_requests"] += 1
                if over_k:
                    tenancy["first_over_k"] += 1
                    sample("first_over_k_samples", {"id": rid, "kind": kind, "tenant": tenant,
                                                    "conversation": h.get("x-tracer-conversation"),
                                                    "presented": names})
            if h.get("x-soak-allowed") == "1":
                tenancy["allowed_requests"] += 1
                choice = body.get("tool_choice") if isinstance(body, dict) else None
                listed = [ref.get("name") or (ref.get("function") or {}).get("name")
                          for ref in ((choice or {}).get("allowed_tools") or {}).get("tools") or []
                          if isinstance(ref, dict)] if isinstance(choice, dict) else []
                outside_set = [n for n in names if n not in allowed_of[tenant]]
                unsent = [n for n in listed if n not in names]
                if outside_set or unsent:
                    tenancy["allowed_violations"] += 1
                    sample("allowed_samples", {"id": rid, "tenant": tenant, "outside_allowed": outside_set,
                                               "allowed_not_presented": unsent})
        if kind == "cut_wait":
            await asyncio.sleep(2.0)
        if kind == "odd_upstream":
            return JSONResponse(odd_answer(rid))
        enc = h.get("x-soak-encoding")
        enc = enc if enc in ("gzip", "deflate") else None
        encodings[enc or "identity"] += 1
        # the tool the agent wants when it was presented, else the first presented that is not another
        # tenant's (so a tenant's messages never name another's tools): deterministic
        foreign = () if tenant is None else tuple(f"{co}_" for i, co in enumerate(COMPANIES) if i != tenant)
        own = [n for n in names if not (foreign and n.startswith(foreign))]
        name = want if want in names else own[0] if own else None
        if h.get("x-soak-final") == "1" or name is None:
            message: dict[str, Any] = {"role": "assistant",
                                       "content": "Done: everything you asked is finished."}
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{rid}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(
                     {"id": rid, "note": "soak" if tenant is None else f"[{COMPANIES[tenant]}]"})}}]}
        if isinstance(body, dict) and body.get("stream"):
            slow = kind == "cut_stream"
            if slow:
                message = {"role": "assistant", "content": "A long answer, sent slowly. " * 4}
            events = sse_events(message, rid, 12 if slow else 3)

            comp = compressor(enc)

            async def gen():
                for e in events:
                    yield comp.compress(e) + comp.flush(zlib.Z_SYNC_FLUSH) if comp else e
                    await asyncio.sleep(0.15 if slow else 0.002)
                if comp:
                    yield comp.flush()
            return StreamingResponse(gen(), media_type="text/event-stream",
                                     headers={"content-encoding": enc} if enc else None)
        if enc:
            data = json.dumps(completion(message, rid)).encode()
            data = gzip.compress(data) if enc == "gzip" else zlib.compress(data)
            return Response(data, media_type="application/json", headers={"content-encoding": enc})
        return JSONResponse(completion(message, rid))

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def soak_records(request):
        return JSONResponse({"records": records, "outside": outside[:1000], "outside_count": len(outside),
                             "by_kind": by_kind, "encodings": encodings, "tenancy": tenancy,
                             "duplicate_posts": sum(r[2] - 1 for r in records.values())})

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
