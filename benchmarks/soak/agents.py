"""The agents: each client draws episodes by weight (``KINDS``) and plays them: valid conversations, hostile
requests, disconnects (see :mod:`benchmarks.soak`)."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections import deque

from benchmarks.soak.constants import MiB
from benchmarks.soak.requester import TENANT, Requester
from benchmarks.soak.traffic import (
    COMPANIES,
    HOSTILE,
    KINDS,
    NOUNS,
    TEMPLATES,
    VALID,
    VERBS,
    family,
    family_turn,
    fill,
    tenant_key,
    tool_def,
)

# an image part as a vision client sends it: a data: URL of a few KB (the log keeps a placeholder)
IMAGE = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 48).decode()


class Agents(Requester):
    # ---- episodes --------------------------------------------------------------------------------
    async def think(self, rng: random.Random) -> None:
        await asyncio.sleep(self.args.think_ms / 1e3 * rng.uniform(0.5, 1.5))

    def agent_tools(self, client: int) -> list[dict]:
        rng = random.Random(1000 + client)
        tools = self.known + rng.sample(self.pool[:60], self.args.extra_tools)
        if self.args.tenants:  # every family, whatever the agent's tenant: a leaked sticky list could show
            tools += [t for tenant in range(self.args.tenants) for t in family(tenant)]
        rng.shuffle(tools)
        return tools

    def tenant_conv(self) -> str | None:
        """The next ``X-Tracer-Conversation`` of the current agent's tenant: 1, 2, ... counted per tenant,
        so every tenant uses the same ids at about the same time; None without tenants."""
        tenant = TENANT.get()
        if tenant is None:
            return None
        self.conv_counter[tenant] = self.conv_counter.get(tenant, 0) + 1
        return str(self.conv_counter[tenant])

    def mark(self, text: str) -> str:
        tenant = TENANT.get()
        return text if tenant is None else f"{text} [{COMPANIES[tenant]}]"

    def key(self, cid: str) -> tuple[int | None, str]:
        return TENANT.get(), cid

    async def conversation(self, session, sdk, client: int, kind: str, rng: random.Random,
                           episode: int) -> None:
        tenant = TENANT.get()
        plan = [(self.mark(fill(text, rng)), wants) for text, wants in rng.choice(TEMPLATES)]
        if tenant is not None:  # a turn of the tenant's own business first, with a tool of its family
            text, wants = family_turn(tenant, rng)
            plan = [(self.mark(text), wants), *plan]
        tools = list(self.agent_tools(client))
        names = {t["function"]["name"] for t in tools}
        system: list[dict] = [{"role": "system",
                               "content": self.mark("You are a travel and office assistant. Use the tools.")}]
        prefix: list[dict] = []
        first = plan[0][0]
        stream = kind in ("stream", "sdk_stream")
        close_at_done = kind == "stream" and episode % 2 == 0
        req_kind = "normal" if kind == "nan_reward" else kind
        tool_choice = None
        if kind == "allowed":
            allowed = [t["function"]["name"] for t in self.known]
            if tenant is not None:
                allowed += [t["function"]["name"] for t in family(tenant)]
            tool_choice = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
                {"type": "function", "function": {"name": n}} for n in allowed]}}
        if kind == "known_only":
            tools = list(self.known)
        elif kind == "developer":
            system = [{"role": "developer", "content": "You are a helpful assistant. Prefer calling tools."}]
        elif kind == "unknown_history":
            prefix = [{"role": "user", "content": "Check the legacy record 42 first"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "call_legacy", "type": "function",
                           "function": {"name": "legacy_lookup", "arguments": '{"id": "42"}'}}]},
                      {"role": "tool", "tool_call_id": "call_legacy", "content": '{"status": "archived"}'}]
            if episode % 2:
                tools.append(tool_def("legacy_lookup", "Look up a record in the legacy archive"))
        elif kind == "orphan_tool":
            prefix = [{"role": "tool", "tool_call_id": "call_trimmed_0", "content": '{"result": "earlier"}'},
                      {"role": "assistant", "content": "I found the earlier result."}]
        elif kind == "bad_arguments":
            prefix = [{"role": "user", "content": "Earlier: the weather in Rome"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "call_bad", "type": "function",
                           "function": {"name": "get_weather", "arguments": '{"city": "Rome"'}}]},
                      {"role": "tool", "tool_call_id": "call_bad", "content": "error: bad arguments"}]
        elif kind == "many_unknown":
            tools += [t for t in self.many if t["function"]["name"] not in names]
        elif kind == "novel_unknown":
            tools += [tool_def(f"novel_{self.run_tag}_{client}_{episode}_{i}",
                               f"{rng.choice(VERBS).capitalize()} a {rng.choice(NOUNS).replace('_', ' ')} "
                               f"(variant {rng.randrange(10**6)})") for i in range(100)]
        conv = (self.tenant_conv() or f"soak-{kind}-{client}-{episode}-{self.run_tag}") \
            if rng.random() < 0.5 else None
        # the id the gateway derives (system + first user message): made unique by a reference
        if conv is None:
            ref = f" (ref {self.run_tag}-{client}-{episode})"
            if prefix and prefix[0]["role"] == "user":
                prefix[0] = {**prefix[0], "content": prefix[0]["content"] + ref}
            else:
                first += ref
        if kind == "normal" and episode % 4 == 1:  # a lone surrogate, as JSON.stringify of a sliced emoji
            first += " \ud83c"
        user = ({"role": "user", "content": [{"type": "text", "text": first},
                                             {"type": "image_url", "image_url": {"url": IMAGE}}]}
                if kind == "content_parts" else {"role": "user", "content": first})
        msgs = system + prefix + [user]
        mode = "nan" if kind == "nan_reward" else rng.choices(("header", "endpoint", "none"), (45, 45, 10))[0]
        use_sdk = sdk if kind in ("sdk", "sdk_stream") else None
        success, cid, extra = True, conv, {}
        n_req = 0

        def encoding() -> str | None:  # the stub compresses a third of the answers with each coding
            return None if use_sdk is not None and stream else rng.choice((None, "gzip", "deflate"))

        for turn, (text, wants) in enumerate(plan):
            if turn:
                msgs.append({"role": "user", "content": text})
            for want in wants:
                r = await self.chat(session, req_kind, msgs, tools, stream=stream, want=want, conv=conv,
                                    sdk=use_sdk, first=n_req == 0, encoding=encoding(),
                                    tool_choice=tool_choice, close_at_done=close_at_done)
                n_req += 1
                if r is None or r["message"] is None:
                    return
                cid, extra = cid or r["conversation"], {**extra, **r["extra"]}
                self.keep_token(cid, extra)
                self.conv_kind.setdefault(self.key(cid), kind)
                msg = r["message"]
                calls = msg.get("tool_calls") or []
                if not calls:
                    success = False
                    break
                called = calls[0]["function"]["name"]
                self.want_hits["presented" if called == want else "missed"] += 1
                success &= called == want
                msgs.append({"role": "assistant", "content": msg.get("content"), "tool_calls": calls[:1]})
                msgs.append({"role": "tool", "tool_call_id": calls[0]["id"],
                             "content": json.dumps({"ok": True, "tool": called, "for": self.mark("")})})
                await self.think(rng)
        outcome = ("success" if success else "failure") if mode == "header" else None
        r = await self.chat(session, req_kind, msgs, tools, stream=stream, final=True, conv=conv,
                            outcome=outcome, sdk=use_sdk, first=n_req == 0, encoding=encoding(),
                            tool_choice=tool_choice, close_at_done=close_at_done)
        if r is None:
            return
        cid, extra = cid or r["conversation"], {**extra, **r["extra"]}
        if cid is None:
            return
        self.keep_token(cid, extra)
        if mode == "header":
            self.reported[self.key(cid)] = (kind, success)
        elif mode == "endpoint":
            payload = json.dumps({"conversation": cid, "success": success, "reward": 1.0 if success else 0.0})
            if await self.post_outcome(session, "outcome", payload.encode(), extra) == 200:
                self.reported[self.key(cid)] = (kind, success)
        elif mode == "nan":
            reward = "NaN" if episode % 2 else "1e999"
            payload = f'{{"conversation": {json.dumps(cid)}, "success": true, "reward": {reward}}}'
            await self.post_outcome(session, "nan_reward", payload.encode(), extra)
            self.unreported.add(self.key(cid))
        else:
            self.unreported.add(self.key(cid))

    def keep_token(self, cid: str | None, extra: dict[str, str]) -> None:
        """Keep the conversation's outcome token for ``cross_token`` (another tenant tries it)."""
        tenant, token = TENANT.get(), extra.get("x-tracer-outcome-token")
        if tenant is not None and cid and token:
            self.tokens.setdefault(tenant, deque(maxlen=50)).append((cid, token))

    async def odd_upstream(self, session, client: int) -> None:
        msgs = [{"role": "user", "content": self.mark(f"Show the files here (odd {self.run_tag}-{self.n})")}]
        await self.chat(session, "odd_upstream", msgs, self.agent_tools(client), want="list_files",
                        first=True)

    async def cross_token(self, session, rng: random.Random) -> None:
        """Another tenant's outcome token, or this tenant's credential, for a conversation it does not
        own: must be a 403 (a 200 or a 404 is a tenant's report reaching another's conversation)."""
        import aiohttp

        own = TENANT.get()
        others = [t for t in self.tokens if t != own and self.tokens[t]]
        variant = rng.randrange(3) if others else 1
        body: dict = {"success": True, "reward": 1.0}
        headers = {"content-type": "application/json"}
        if others:
            cid, token = rng.choice(list(self.tokens[rng.choice(others)]))
        else:
            cid, token = "1", "0" * 64
        if variant == 0:  # another tenant's token, for another id than its own
            headers["x-tracer-outcome-token"] = token
            body["conversation"] = f"{cid}0"
        elif variant == 1:  # this tenant's credential, the other's id and tenant, no token
            headers["authorization"] = f"Bearer {tenant_key(own or 0)}"
            body.update(conversation=cid, tenant=token[:32])
        else:  # this tenant's own token for the other tenant's id
            mine = list(self.tokens.get(own, ())) if own is not None else []
            pick = next(((c, t) for c, t in reversed(mine) if c != cid), None)
            if pick is None:
                headers["authorization"] = f"Bearer {tenant_key(own or 0)}"
            else:
                headers["x-tracer-outcome-token"] = pick[1]
            body["conversation"] = cid
        rid = self.next_id()
        try:
            async with session.post(f"{self.gw}/v1/tracer/outcome", data=json.dumps(body).encode(),
                                    headers=headers) as r:
                raw = await r.read()
            self.record("cross_token", rid, r.status, detail=f"variant {variant}: "
                        + raw[:250].decode("utf-8", "replace"))
            if r.status in (200, 404):
                self.cross_token_accepted += 1
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            self.record("cross_token", rid, None, type(e).__name__, detail=str(e))

    async def hostile(self, session, kind: str, rng: random.Random, client: int, episode: int) -> None:
        import aiohttp

        if kind in ("bad_json", "wrong_types", "big_value", "outcome_bad", "reload"):
            msgs = [{"role": "user", "content": "hello"}]
            path, body = "/v1/chat/completions", b""
            if kind == "bad_json":
                body = rng.choice([b'{"messages": [', b"not json at all",
                                   b'{"messages": [{"role": "user"}],}', b"\xff\xfe\x00garbage"])
            elif kind == "wrong_types":
                body = json.dumps(rng.choice([
                    {"messages": "hi"}, {"messages": []}, {"messages": [{"role": 5, "content": "x"}]},
                    {"messages": msgs, "tools": {"a": 1}},
                    {"messages": msgs, "tools": [{"type": "function", "function": {"name": 7}}]},
                    {"messages": msgs, "tools": [{"type": "function"}]},
                    {"messages": [{"role": "assistant", "tool_calls": "x"}]},
                    {"messages": msgs, "tools": [tool_def("a", "x"), tool_def("a", "y")]},
                    [1, 2, 3]])).encode()
            elif kind == "big_value":
                big = "r" * MiB
                tools = self.agent_tools(client)
                body = json.dumps(rng.choice([
                    {"messages": [{"role": big, "content": "x"}, *msgs], "tools": tools},
                    {"messages": msgs,
                     "tools": [*tools, tool_def(big, "a tool with a huge name")]}])).encode()
            elif kind == "outcome_bad":
                path = "/v1/tracer/outcome"
                body = rng.choice([b"{not json", b'{"conversation": 5, "success": true}',
                                   b'{"conversation": "nobody-' + self.run_tag.encode()
                                   + b'", "success": "yes"}',
                                   b'{"conversation": "x", "success": true, "reward": "high"}',
                                   b'{"conversation": "nobody", "success": true, "reward": Infinity}', b"[]"])
            elif kind == "reload":
                path = "/v1/tracer/reload"
            rid = self.next_id()
            try:
                async with session.post(f"{self.gw}{path}", data=body, headers={
                        "content-type": "application/json", "x-soak-id": rid, "x-soak-kind": kind}) as r:
                    raw = await r.read()
                sel = r.headers.get("x-tracer-selection-ms")
                self.record(kind, rid, r.status, sel_ms=float(sel) if sel else None,
                            detail=raw[:300].decode("utf-8", "replace"))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                self.record(kind, rid, None, type(e).__name__, detail=str(e))
        elif kind == "traversal":
            path = rng.choice(["/v1/../admin", "/v1/%2e%2e/admin", "/v1/..%2fadmin",
                               "/v1/x/../../../etc/passwd", "/v1/models/..%5c..%5cadmin",
                               "/v1/%2E%2E/%2E%2E/soak/records", "/v1/./../health"])
            method = rng.choice(["GET", "POST"])
            status, exc = await self.raw([self.http(method, path, b"{}" if method == "POST" else b"")])
            self.record(kind, self.next_id(), status, exc, detail=path)
        elif kind == "oversized":
            head_body = b'{"model": "m", "messages": [{"role": "user", "content": "'
            tail = b'"}]}'
            if episode % 2:  # declared: refused on the header, before the body
                total = len(head_body) + len(self.big) + len(tail)
                head = self.http("POST", "/v1/chat/completions", length=total)
                parts = [head, head_body] + [self.big[i:i + 256 * 1024]
                                             for i in range(0, len(self.big), 256 * 1024)]
                status, exc = await self.raw(parts + [tail], pause_after_first=1.0)
            else:  # chunked: refused once the read passes the limit
                head = self.http("POST", "/v1/chat/completions", headers={"Transfer-Encoding": "chunked"})
                data = head_body + self.big + tail
                step = 256 * 1024
                parts = [head] + [b"%x\r\n" % len(data[i:i + step]) + data[i:i + step] + b"\r\n"
                                  for i in range(0, len(data), step)] + [b"0\r\n\r\n"]
                status, exc = await self.raw(parts)
            # a server that answered 413 and closed while the body was still being sent may reset the socket
            self.record(kind, self.next_id(), status, None if status is not None else exc,
                        detail=f"exception {exc}" if exc else "")

    async def disconnect(self, session, kind: str, rng: random.Random, client: int, episode: int) -> None:
        import aiohttp

        rid = self.next_id()
        if kind == "cut_body":
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 4000}],
                               "tools": self.agent_tools(client)}).encode()
            head = self.http("POST", "/v1/chat/completions", length=len(body) + 50_000)
            _, exc = await self.raw([head, body[:len(body) // 2]], read=False, abort=bool(episode % 2))
            self.record(kind, rid, None, exc)
            return
        conv = self.tenant_conv() or f"soak-{kind}-{client}-{episode}-{self.run_tag}"
        msgs = [{"role": "user", "content": self.mark(f"Look up flights to Denver ({conv} {self.run_tag})")}]
        body = {"model": "stub-model", "messages": msgs, "tools": self.agent_tools(client)}
        hdrs = self.headers(kind, rid, "search_flights", False, conv, "success", first=True)
        self.conv_kind[self.key(conv)] = kind
        if kind == "cut_stream":
            self.cut_conversations.add(self.key(conv))
            body["stream"] = True
            try:
                async with session.post(f"{self.gw}/v1/chat/completions", data=json.dumps(body).encode(),
                                        headers=hdrs) as r:
                    status = r.status
                    await asyncio.wait_for(r.content.readany(), 30)
                    r.close()  # drop the connection mid-stream
                self.record(kind, rid, status)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                self.record(kind, rid, None, type(e).__name__)
        else:  # cut_wait: the stub thinks 2 s, the client gives up after 0.3 s
            try:
                async with session.post(f"{self.gw}/v1/chat/completions", data=json.dumps(body).encode(),
                                        headers=hdrs, timeout=aiohttp.ClientTimeout(total=0.3)) as r:
                    await r.read()
                    self.record(kind, rid, r.status)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                self.record(kind, rid, None, type(e).__name__)

    async def client(self, session, sdk, client: int, deadline: float) -> None:
        rng = random.Random(self.args.seed * 10_000 + client)
        if self.args.tenants:
            TENANT.set(client % self.args.tenants)  # this task's context: every request of this agent
        names = self.args.kinds or list(KINDS)
        weights = [KINDS[k][1] for k in names]
        await asyncio.sleep(rng.uniform(0, self.args.think_ms / 1e3))
        episode = 0
        while not self.stop and time.monotonic() < deadline and episode < self.args.max_episodes:
            episode += 1
            kind = rng.choices(names, weights)[0]
            cls = KINDS[kind][0]
            try:
                if kind == "odd_upstream":
                    await self.odd_upstream(session, client)
                elif kind == "cross_token":
                    await self.cross_token(session, rng)
                elif cls == VALID or kind == "nan_reward":
                    await self.conversation(session, sdk, client, kind, rng, episode)
                elif cls == HOSTILE:
                    await self.hostile(session, kind, rng, client, episode)
                else:
                    await self.disconnect(session, kind, rng, client, episode)
            except Exception as e:  # noqa: BLE001  (a bug of this script: counted, never silent)
                self.record(kind, self.next_id(), None, f"soak bug {type(e).__name__}: {e}"[:200])
            await self.think(rng)
