"""Soak of ``tracer serve --log`` on loopback: mixed traffic for minutes, then ``tracer update`` twice.

    python -m benchmarks.soak_gateway                                # 10 minutes, 16 clients -> outputs/soak/
    python -m benchmarks.soak_gateway --minutes 1 --clients 4 --out /tmp/soak   # a short check of the script

Not a test: a benchmark of the production loop (issue 32). Three kinds of processes, as in
benchmarks/bench_gateway.py: a stub upstream (uvicorn + Starlette, this file with ``--role stub``), the
gateway (``python -m tracer.cli serve --log DIR``, or ``-m tracer`` once the package has a ``__main__``; only
the flags its ``--help`` lists are passed; run in a temporary working directory so any embedding cache it
writes is its own) and this load generator (asyncio; aiohttp, raw sockets, and the official ``openai`` client
for part of the conversations).

**The index**: ``tracer_plus`` (the default scorer and the one docs/gateway.md serves) fitted on
``data/example`` (6 tools, 5 trajectories): it builds in ~15 s, so the run measures the gateway and not a fit,
and its tools and their words are what the clients' conversations ask for, so the stub's calls are to tools
the index knows and the update has something to learn. It is built once and cached under
``.cache/soak/<scorer>-<hash of the dataset and tracer's source but serve/ and cli/>/`` (``--role build``, in
a subprocess: the load generator never imports torch), and copied to a temporary directory for each run, since
the update writes to it.

**The traffic**: ``--clients`` agents for ``--minutes``, each drawing its next episode at random
(weights in ``KINDS``) after a pause drawn from [0.5, 1.5] x ``--think-ms``. Every agent carries its own
registry: the index's 6 tools plus 30 of its own the index never saw (``--extra-tools``), so a valid
request carries more tools than the sticky cap (4 k) and a fallback to the whole list is visible at the
upstream. Episodes, each classified in advance:

- valid conversations (several turns; each answer's tool call and a tool result appended; the outcome
  reported by ``X-Tracer-Outcome`` on the last request, by ``POST /v1/tracer/outcome`` with the
  ``X-Tracer-Outcome-Token`` (any ``x-tracer-*`` answer header) the gateway sent back, or not at all;
  the stub calls the tool the agent wants, named in a header, when it was presented, else the first
  presented one, and the agent reports failure when it was not):
  ``normal``, ``known_only`` (only the 6 indexed tools), ``sdk`` (the official ``openai`` client),
  ``stream`` (SSE), ``developer`` (a ``developer`` message), ``unknown_history`` (the history called a
  tool the index does not know), ``orphan_tool`` (a tool message whose call was trimmed),
  ``bad_arguments`` (malformed ``arguments`` earlier in the history), ``content_parts`` (content as a
  list of parts), ``many_unknown`` (300 more tools, the same for every agent), ``novel_unknown`` (100
  tools with new names each time), ``odd_upstream`` (the stub answers ``message`` as a string, a number,
  null, no choices...: the gateway must pass it through);
- hostile requests (must be refused with a 4xx, never a 5xx): ``bad_json``, ``wrong_types``,
  ``traversal`` (``/v1/../admin`` and its encodings, raw socket; the stub records any path that reached
  it outside ``/v1/``), ``oversized`` (over ``--max-body-bytes``, declared and chunked), ``big_value``
  (a 1 MB role or tool name), ``outcome_bad`` (malformed outcome bodies), ``nan_reward`` (a real
  conversation's outcome with ``reward`` NaN or 1e999), ``reload`` (``POST /v1/tracer/reload`` without
  credentials);
- disconnects (no status expected; the gateway must stay up and quiet): ``cut_body`` (a raw socket
  closes mid-body), ``cut_stream`` (the client closes a stream after its first chunk; its
  ``X-Tracer-Outcome: success`` must not log a success), ``cut_wait`` (the client gives up while the
  upstream is still thinking).

**Errors** are valid requests answered non-2xx or with an exception, or with a body that is not a chat
completion. **Fallbacks**: a valid request with more than k tools that reached the stub with more than
the sticky cap (``4 k``, or ``--max-presented``), counted at the upstream by the request id header the
client sends; also a missing or zero ``X-Tracer-Selection-Ms`` on such a request, and the gateway's own
``tracer_errors_total{kind="selection"}``. A health prober (``GET /health`` every second) measures
stalls of the event loop.

**Samples** every ``--sample-every`` s: the gateway's RSS, open fds, threads and CPU time (``/proc``), the
log directory's and the gateway's ``.cache`` bytes, the load average, and the gateway's ``/metrics``.
Start = the first sample after the warm-up (the first minute, or a third of a shorter run); slope = a
least-squares line over the samples after the warm-up, in MB per minute.

**At the end** the gateway gets SIGTERM (it drains and writes its pending conversations), its log is read
(lines, outcomes, duplicates, non-finite rewards, what ``tools.json`` registered), then ``tracer update
--index IDX --log DIR`` runs twice (the second must apply nothing new) and ``--role check`` loads the
updated index and ranks probe contexts with it and with the original. Written to ``--out``:
``soak.json`` (everything), ``soak.md`` (the summary), ``gateway.stderr.log``. Exit status 1 when a
valid request errored or fell back, or the gateway died; everything else the run saw (hostile 5xx,
stalls, growth, log or update trouble) is listed under Findings. ``--kinds a,b`` draws only those
episodes (a check of the script, not a soak).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.loopback import free_port, wait_ready

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "example"
MiB = 1024 * 1024

# ---------------------------------------------------------------------------------------------------
# the traffic
# ---------------------------------------------------------------------------------------------------
VALID, HOSTILE, DISCONNECT = "valid", "hostile", "disconnect"
# kind: (class, weight per episode, statuses a hostile request may be answered with)
KINDS: dict[str, tuple[str, float, frozenset[int]]] = {
    "normal": (VALID, 26, frozenset()),
    "known_only": (VALID, 5, frozenset()),
    "sdk": (VALID, 8, frozenset()),
    "stream": (VALID, 12, frozenset()),
    "developer": (VALID, 6, frozenset()),
    "unknown_history": (VALID, 5, frozenset()),
    "orphan_tool": (VALID, 4, frozenset()),
    "bad_arguments": (VALID, 4, frozenset()),
    "content_parts": (VALID, 3, frozenset()),
    "many_unknown": (VALID, 2.5, frozenset()),
    "novel_unknown": (VALID, 0.4, frozenset()),
    "odd_upstream": (VALID, 3, frozenset()),
    "bad_json": (HOSTILE, 3, frozenset({400})),
    "wrong_types": (HOSTILE, 3, frozenset({400})),
    "traversal": (HOSTILE, 2, frozenset({400, 404})),
    "oversized": (HOSTILE, 0.3, frozenset({413})),
    "big_value": (HOSTILE, 0.3, frozenset({200, 400, 413, 422})),
    "outcome_bad": (HOSTILE, 1.5, frozenset({400, 401, 403, 404, 413, 422})),
    "nan_reward": (HOSTILE, 1, frozenset({400, 401, 403, 422})),
    "reload": (HOSTILE, 0.2, frozenset({401, 403, 404, 405})),
    "cut_body": (DISCONNECT, 2, frozenset()),
    "cut_stream": (DISCONNECT, 2, frozenset()),
    "cut_wait": (DISCONNECT, 1, frozenset()),
}
# requests counted apart from their episode's kind
EXTRA_KINDS = {"outcome": VALID}

# a conversation: user turns, each with the tools the agent wants called in order
TEMPLATES: list[list[tuple[str, list[str]]]] = [
    [("Find me a flight from {a} to {b} {when} and book it", ["search_flights", "book_flight"])],
    [("Search flights to {b} on {day} then book the cheapest", ["search_flights", "book_flight"]),
     ("Actually cancel that booking", ["cancel_booking"])],
    [("What is the weather in {city}? Email it to {name}", ["get_weather", "send_email"])],
    [("Look up flights to {b}", ["search_flights"]), ("Tell me the weather in {b}", ["get_weather"])],
    [("Show the files here", ["list_files"])],
    [("Cancel my booking {ref}", ["cancel_booking"])],
    [("Email {name} the list of files in this folder", ["list_files", "send_email"])],
    [("Book flight {fn} for me", ["book_flight"])],
    [("Is it going to rain in {city} {when}?", ["get_weather"])],
]
SLOTS = {
    "a": ["SFO", "LAX", "SEA", "BOS", "ORD"], "b": ["JFK", "Denver", "Boston", "Miami", "Austin", "Paris"],
    "when": ["tomorrow", "next week", "tonight", "on Monday"], "day": ["Friday", "Saturday", "the 3rd"],
    "city": ["Paris", "Rome", "Oslo", "Lima", "Tokyo", "Denver"], "name": ["Bob", "Alice", "Chen", "Priya"],
    "ref": ["BK-1042", "BK-77", "ZX-9"], "fn": ["UA 120", "DL 88", "AF 7"],
}
VERBS = ["create", "update", "delete", "get", "list", "search", "archive", "export", "import", "approve",
         "reject", "assign", "close", "reopen", "merge", "schedule", "translate", "summarize", "share", "tag"]
NOUNS = ["invoice", "ticket", "calendar_event", "contact", "repository", "pull_request", "spreadsheet",
         "document", "payment", "refund", "order", "shipment", "customer", "lead", "meeting", "note", "task",
         "project", "user_account", "password_reset", "vm_instance", "dns_record", "alert", "incident",
         "dashboard", "report", "playlist", "recipe", "expense", "timesheet"]
SYSTEMS = ["billing", "helpdesk", "CRM", "cloud", "HR", "git", "media", "finance"]


def tool_def(name: str, description: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {"id": {"type": "string", "description": "the object's identifier"},
                                         "note": {"type": "string", "description": "free text"}},
        "required": ["id"]}}}


def tool_pool() -> list[dict[str, Any]]:
    """600 tools the index never saw (verb x noun), in a fixed shuffled order."""
    pool = [tool_def(f"{v}_{n}", f"{v.capitalize()} a {n.replace('_', ' ')} in the "
                                 f"{SYSTEMS[(i * 7 + j) % len(SYSTEMS)]} system")
            for i, v in enumerate(VERBS) for j, n in enumerate(NOUNS)]
    random.Random(0).shuffle(pool)
    return pool


def known_tools() -> list[dict[str, Any]]:
    return json.loads((DATA / "tools.json").read_text())


def fill(text: str, rng: random.Random) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: rng.choice(SLOTS[m.group(1)]), text)


# ---------------------------------------------------------------------------------------------------
# the stub upstream (--role stub)
# ---------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------
# the index (--role build, --role check): these import tracer (and torch) in their own process
# ---------------------------------------------------------------------------------------------------
def index_key(scorer: str) -> str:
    h = hashlib.sha256(scorer.encode())
    # the dataset and the code that builds and saves an index (not the serving front doors, which do not)
    src = [p for p in (*(ROOT / "tracer").rglob("*.py"), *(ROOT / "tracer").rglob("*.yaml"))
           if p.relative_to(ROOT).parts[1] not in ("serve", "cli")]
    for path in sorted([*DATA.iterdir(), *src]):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build_index(directory: Path, scorer: str) -> None:
    from tracer.retriever import Retriever

    Retriever.from_dataset(DATA, scorer, device="cpu", cache_dir=None).save(directory)


def probe_contexts() -> list[tuple[str, str]]:
    """(user message, the tool it should call first) for each template, slots filled the same way."""
    rng = random.Random(7)
    return [(fill(t[0][0], rng), t[0][1][0]) for t in TEMPLATES]


def check_index(index: Path, original: Path) -> dict[str, Any]:
    """Load the updated index (and the original) and rank the probe contexts with both."""
    from tracer.retriever import Retriever

    before = Retriever.load(original, cache_dir=None, device="cpu")
    after = Retriever.load(index, cache_dir=None, device="cpu")
    probes = []
    for text, want in probe_contexts():
        msgs = [{"role": "user", "content": text}]
        rb, ra = before.rank(msgs), after.rank(msgs)
        probes.append({"context": text, "want": want,
                       "rank_before": rb.index(want) + 1 if want in rb else None,
                       "rank_after": ra.index(want) + 1 if want in ra else None,
                       "top3_before": rb[:3], "top3_after": ra[:3]})
    old = set(before.registry.names)
    return {"loads": True, "tools_before": len(before.registry), "tools_after": len(after.registry),
            "new_tools": [n for n in after.registry.names if n not in old][:100], "probes": probes}


def cached_index(scorer: str, env: dict[str, str]) -> Path:
    key = index_key(scorer)
    target = ROOT / ".cache" / "soak" / f"{scorer}-{key}"
    if (target / "meta.json").exists() or (target / "CURRENT").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"building the index ({scorer} on {DATA.relative_to(ROOT)}) -> {target}", flush=True)
    subprocess.run([sys.executable, __file__, "--role", "build", "--index", str(tmp), "--scorer", scorer],
                   env=env, cwd=ROOT, check=True, timeout=1200)
    try:
        os.replace(tmp, target)
    except OSError:  # built meanwhile by another run
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, float]:
    """RSS (MB), threads, open fds and CPU seconds of a live process (Linux /proc)."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            out["rss_mb"] = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            out["threads"] = int(line.split()[1])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def dir_bytes(path: Path) -> tuple[int, int, int]:
    """(apparent bytes, bytes allocated on disk, files) under ``path``."""
    size = disk = files = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(dirpath, n))
                size, disk, files = size + st.st_size, disk + st.st_blocks * 512, files + 1
    return size, disk, files


METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value}, histogram buckets and _created left out."""
    out = {}
    for line in text.splitlines():
        m = METRIC.match(line)
        if m and not m.group(1).endswith(("_bucket", "_created")):
            with contextlib.suppress(ValueError):
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError, IndexError):
        mem = f"{int(Path('/proc/meminfo').read_text().split()[1]) / MiB:.1f} GiB"
    return {"cpu": model, "cores": os.cpu_count(), "memory": mem, "python": sys.version.split()[0]}


def help_flags(cmd: list[str], env: dict[str, str]) -> set[str]:
    """The long options a command's --help lists."""
    out = subprocess.run([*cmd, "--help"], check=False, env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} --help failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout))


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


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# ---------------------------------------------------------------------------------------------------
# the load generator
# ---------------------------------------------------------------------------------------------------
class Stats:
    def __init__(self, cls: str):
        self.cls = cls
        self.requests = 0
        self.status: Counter[str] = Counter()
        self.exceptions: Counter[str] = Counter()
        self.errors = 0        # valid: non-2xx, exception or not a completion
        self.unexpected = 0    # hostile: a status outside the expected set (5xx included)
        self.server_errors = 0  # any 5xx
        self.fell_back = 0
        self.over_k = 0        # valid requests with more than k tools (selection expected)
        self.selection_ms: list[float] = []  # X-Tracer-Selection-Ms of the answers that carried it
        self.latency_ms: list[float] = []    # chat requests answered: time to the whole answer

    def as_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "requests": self.requests, "status": dict(self.status),
                "exceptions": dict(self.exceptions), "errors": self.errors, "unexpected": self.unexpected,
                "server_errors": self.server_errors, "fell_back": self.fell_back, "over_k": self.over_k,
                "selection_ms_p50": percentile(self.selection_ms, 50), "selection_ms_max":
                    max(self.selection_ms) if self.selection_ms else None,
                "latency_ms_p50": percentile(self.latency_ms, 50),
                "latency_ms_p99": percentile(self.latency_ms, 99),
                "latency_ms_max": max(self.latency_ms) if self.latency_ms else None}


class Soak:
    def __init__(self, args: argparse.Namespace, gw_port: int, stub_port: int, gateway: subprocess.Popen,
                 log_dir: Path, cache_dir: Path):
        self.args, self.gw_port, self.stub_port, self.gateway = args, gw_port, stub_port, gateway
        self.gw = f"http://127.0.0.1:{gw_port}"
        self.log_dir, self.cache_dir = log_dir, cache_dir
        self.k = args.k
        self.cap = args.max_presented or 4 * args.k
        self.stats: dict[str, Stats] = {}
        self.sent: list[tuple[str, str, int, float | None]] = []  # valid answered: (id, kind, tools, sel ms)
        self.error_samples: list[dict[str, Any]] = []
        self.slow: list[dict[str, Any]] = []  # answers that took over 1 s
        self.unexpected_samples: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.health: list[tuple[float, float, int | None]] = []
        # conversation -> (kind, success) reported by the client
        self.reported: dict[str, tuple[str, bool]] = {}
        self.unreported: set[str] = set()
        self.cut_conversations: set[str] = set()
        self.conv_kind: dict[str, str] = {}
        self.want_hits = Counter()
        self.extra_headers_seen: Counter[str] = Counter()
        self.n = 0
        self.stop = False
        self.died_at: float | None = None
        self.t0 = time.monotonic()
        self.pool = tool_pool()
        self.known = known_tools()
        self.many = self.pool[:300]
        self.run_tag = os.urandom(3).hex()
        self.big = b"x" * (args.max_body_bytes + MiB)

    # ---- bookkeeping -----------------------------------------------------------------------------
    def stat(self, kind: str) -> Stats:
        if kind not in self.stats:
            cls = KINDS[kind][0] if kind in KINDS else EXTRA_KINDS[kind]
            self.stats[kind] = Stats(cls)
        return self.stats[kind]

    def next_id(self) -> str:
        self.n += 1
        return f"{self.run_tag}-{self.n}"

    def record(self, kind: str, rid: str, status: int | None, exc: str | None = None, *, n_tools: int = 0,
               sel_ms: float | None = None, latency_ms: float | None = None, bad_reply: bool = False,
               detail: str = "") -> None:
        st = self.stat(kind)
        st.requests += 1
        if status is not None:
            st.status[str(status)] += 1
            if status >= 500:
                st.server_errors += 1
        if exc is not None:
            st.exceptions[exc] += 1
        if sel_ms is not None:
            st.selection_ms.append(sel_ms)
        if latency_ms is not None:
            st.latency_ms.append(latency_ms)
            if latency_ms > 1000 and len(self.slow) < 100:
                self.slow.append({"t": round(time.monotonic() - self.t0, 1), "kind": kind, "latency_ms":
                                  round(latency_ms), "selection_ms": sel_ms, "tools": n_tools})
        sample = {"t": round(time.monotonic() - self.t0, 1), "kind": kind, "id": rid, "status": status,
                  "exception": exc, "detail": detail[:300]}
        if st.cls == VALID:
            failed = exc is not None or status is None or not 200 <= status < 300 or bad_reply
            if failed:
                st.errors += 1
                if len(self.error_samples) < 50:
                    self.error_samples.append(sample)
            elif n_tools > self.k:
                st.over_k += 1
                self.sent.append((rid, kind, n_tools, sel_ms))
        elif st.cls == HOSTILE and (exc is not None or status not in KINDS[kind][2]):
            st.unexpected += 1
            if len(self.unexpected_samples) < 50:
                self.unexpected_samples.append(sample)

    # ---- one chat request ------------------------------------------------------------------------
    def headers(self, kind: str, rid: str, want: str | None, final: bool, conv: str | None,
                outcome: str | None) -> dict[str, str]:
        h = {"content-type": "application/json", "authorization": "Bearer soak-client-key",
             "x-soak-id": rid, "x-soak-kind": kind}
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
                   outcome: str | None = None, sdk=None) -> dict[str, Any] | None:
        """Send one chat request; the reply's message, conversation id and extra headers, or None."""
        import aiohttp

        rid = self.next_id()
        hdrs = self.headers(kind, rid, want, final, conv, outcome)
        body = {"model": "stub-model", "messages": messages, "tools": tools}
        if stream:
            body["stream"] = True
        if sdk is not None:
            return await self.chat_sdk(sdk, kind, rid, body, hdrs)
        t0 = time.perf_counter()
        try:
            async with session.post(f"{self.gw}/v1/chat/completions", data=json.dumps(body).encode(),
                                    headers=hdrs) as r:
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

        extra_headers = {k: v for k, v in hdrs.items() if k not in ("content-type", "authorization")}
        t0 = time.perf_counter()
        try:
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
                    latency_ms=(time.perf_counter() - t0) * 1e3)
        extra = {k.lower(): v for k, v in raw.headers.items() if k.lower().startswith("x-tracer-")
                 and k.lower() not in ("x-tracer-conversation", "x-tracer-selection-ms")}
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

    # ---- episodes --------------------------------------------------------------------------------
    async def think(self, rng: random.Random) -> None:
        await asyncio.sleep(self.args.think_ms / 1e3 * rng.uniform(0.5, 1.5))

    def agent_tools(self, client: int) -> list[dict]:
        rng = random.Random(1000 + client)
        tools = self.known + rng.sample(self.pool[:60], self.args.extra_tools)
        rng.shuffle(tools)
        return tools

    async def conversation(self, session, sdk, client: int, kind: str, rng: random.Random,
                           episode: int) -> None:
        plan = [(fill(text, rng), wants) for text, wants in rng.choice(TEMPLATES)]
        tools = list(self.agent_tools(client))
        names = {t["function"]["name"] for t in tools}
        system: list[dict] = [{"role": "system",
                               "content": "You are a travel and office assistant. Use the tools."}]
        prefix: list[dict] = []
        first = plan[0][0]
        stream = kind == "stream"
        req_kind = "normal" if kind == "nan_reward" else kind
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
        conv = f"soak-{kind}-{client}-{episode}-{self.run_tag}" if rng.random() < 0.5 else None
        # the id the gateway derives (system + first user message): made unique by a reference
        if conv is None:
            ref = f" (ref {self.run_tag}-{client}-{episode})"
            if prefix and prefix[0]["role"] == "user":
                prefix[0] = {**prefix[0], "content": prefix[0]["content"] + ref}
            else:
                first += ref
        user = ({"role": "user", "content": [{"type": "text", "text": first}]} if kind == "content_parts"
                else {"role": "user", "content": first})
        msgs = system + prefix + [user]
        mode = "nan" if kind == "nan_reward" else rng.choices(("header", "endpoint", "none"), (45, 45, 10))[0]
        use_sdk = sdk if kind == "sdk" else None
        success, cid, extra = True, conv, {}
        for turn, (text, wants) in enumerate(plan):
            if turn:
                msgs.append({"role": "user", "content": text})
            for want in wants:
                r = await self.chat(session, req_kind, msgs, tools, stream=stream, want=want, conv=conv,
                                    sdk=use_sdk)
                if r is None or r["message"] is None:
                    return
                cid, extra = cid or r["conversation"], {**extra, **r["extra"]}
                self.conv_kind.setdefault(cid, kind)
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
                             "content": json.dumps({"ok": True, "tool": called})})
                await self.think(rng)
        outcome = ("success" if success else "failure") if mode == "header" else None
        r = await self.chat(session, req_kind, msgs, tools, stream=stream, final=True, conv=conv,
                            outcome=outcome, sdk=use_sdk)
        if r is None:
            return
        cid, extra = cid or r["conversation"], {**extra, **r["extra"]}
        if cid is None:
            return
        if mode == "header":
            self.reported[cid] = (kind, success)
        elif mode == "endpoint":
            payload = json.dumps({"conversation": cid, "success": success, "reward": 1.0 if success else 0.0})
            if await self.post_outcome(session, "outcome", payload.encode(), extra) == 200:
                self.reported[cid] = (kind, success)
        elif mode == "nan":
            reward = "NaN" if episode % 2 else "1e999"
            payload = f'{{"conversation": {json.dumps(cid)}, "success": true, "reward": {reward}}}'
            await self.post_outcome(session, "nan_reward", payload.encode(), extra)
            self.unreported.add(cid)
        else:
            self.unreported.add(cid)

    async def odd_upstream(self, session, client: int) -> None:
        msgs = [{"role": "user", "content": f"Show the files here (odd {self.run_tag}-{self.n})"}]
        await self.chat(session, "odd_upstream", msgs, self.agent_tools(client), want="list_files")

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
        conv = f"soak-{kind}-{client}-{episode}-{self.run_tag}"
        msgs = [{"role": "user", "content": f"Look up flights to Denver ({conv})"}]
        body = {"model": "stub-model", "messages": msgs, "tools": self.agent_tools(client)}
        hdrs = self.headers(kind, rid, "search_flights", False, conv, "success")
        if kind == "cut_stream":
            self.cut_conversations.add(conv)
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
                elif cls == VALID or kind == "nan_reward":
                    await self.conversation(session, sdk, client, kind, rng, episode)
                elif cls == HOSTILE:
                    await self.hostile(session, kind, rng, client, episode)
                else:
                    await self.disconnect(session, kind, rng, client, episode)
            except Exception as e:  # noqa: BLE001  (a bug of this script: counted, never silent)
                self.record(kind, self.next_id(), None, f"soak bug {type(e).__name__}: {e}"[:200])
            await self.think(rng)

    # ---- observers -------------------------------------------------------------------------------
    async def sample(self, session) -> None:
        t = time.monotonic() - self.t0
        s: dict[str, Any] = {"t": round(t, 1), "load1": os.getloadavg()[0],
                             "requests": sum(st.requests for st in self.stats.values())}
        if self.gateway.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                s.update(proc_status(self.gateway.pid))
        s["log_bytes"], s["log_disk_bytes"], s["log_files"] = dir_bytes(self.log_dir)
        s["cache_bytes"], s["cache_disk_bytes"], s["cache_files"] = dir_bytes(self.cache_dir)
        try:
            async with session.get(f"{self.gw}/metrics") as r:
                s["metrics"] = parse_metrics((await r.read()).decode())
        except Exception as e:  # noqa: BLE001
            s["metrics_error"] = type(e).__name__
        self.samples.append(s)

    async def sampler(self, session, deadline: float) -> None:
        while not self.stop and time.monotonic() < deadline:
            await self.sample(session)
            if self.gateway.poll() is not None:
                self.died_at, self.stop = time.monotonic() - self.t0, True
                return
            await asyncio.sleep(self.args.sample_every)

    async def prober(self, session, deadline: float) -> None:
        import aiohttp

        while not self.stop and time.monotonic() < deadline:
            t = time.monotonic()
            status = None
            try:
                async with session.get(f"{self.gw}/health", timeout=aiohttp.ClientTimeout(total=60)) as r:
                    await r.read()
                    status = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            self.health.append((round(t - self.t0, 2), (time.monotonic() - t) * 1e3, status))
            await asyncio.sleep(1.0)

    async def run(self) -> None:
        import aiohttp
        import openai

        duration = self.args.minutes * 60
        self.t0 = time.monotonic()
        deadline = self.t0 + duration
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=timeout) as session, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=70)) as observer:
            sdk = openai.AsyncOpenAI(base_url=f"{self.gw}/v1", api_key="soak-client-key", max_retries=0,
                                     timeout=120.0)
            clients = [asyncio.ensure_future(self.client(session, sdk, c, deadline))
                       for c in range(self.args.clients)]
            watchers = [asyncio.ensure_future(self.sampler(observer, deadline)),
                        asyncio.ensure_future(self.prober(observer, deadline))]
            # every episode is bounded (a few requests, each within 120 s): the last ones end soon after the
            # deadline
            _, pending = await asyncio.wait(clients, timeout=duration + 300)
            self.stop = True
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, *watchers, return_exceptions=True)
            await self.sample(observer)  # the last sample, after the traffic
            await sdk.close()


# ---------------------------------------------------------------------------------------------------
# the end: shutdown, the log, the updates
# ---------------------------------------------------------------------------------------------------
def analyze_log(log_dir: Path, soak: Soak) -> dict[str, Any]:
    path = log_dir / "trajectories.jsonl"
    out: dict[str, Any] = {"exists": path.exists()}
    if not path.exists():
        return out
    lines = unparsable = nonfinite = 0
    outcome: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    success_groups: set[str] = set()
    called: set[str] = set()
    roles: Counter[str] = Counter()
    max_line = 0
    with open(path, "rb") as f:
        for line in f:
            lines += 1
            max_line = max(max_line, len(line))
            try:
                rec = json.loads(line)
            except ValueError:
                unparsable += 1
                continue
            if not isinstance(rec, dict):
                unparsable += 1
                continue
            reward = rec.get("reward")
            if isinstance(reward, float) and not math.isfinite(reward):
                nonfinite += 1
            meta = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
            outcome[f"{meta.get('outcome')}/{'success' if rec.get('success') else 'failure'}"] += 1
            group = str(rec.get("group"))
            groups[group] += 1
            if rec.get("success"):
                success_groups.add(group)
            called.update(c for c in meta.get("called") or [] if isinstance(c, str))
            for m in rec.get("messages") or []:
                if isinstance(m, dict):
                    roles[str(m.get("role"))[:20]] += 1
    tools_json = log_dir / "tools.json"
    registered: list[str] = []
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        registered = [t["function"]["name"] for t in json.loads(tools_json.read_text())]
    reported_success = {c for c, (_, s) in soak.reported.items() if s}
    reported = set(soak.reported)
    return {
        "exists": True, "lines": lines, "bytes": path.stat().st_size, "max_line_bytes": max_line,
        "bytes_per_line": round(path.stat().st_size / max(lines, 1)), "unparsable_lines": unparsable,
        "nonfinite_rewards": nonfinite, "by_outcome": dict(outcome), "roles": dict(roles),
        "conversations": len(groups), "conversations_logged_twice": sum(1 for n in groups.values() if n > 1),
        "reported_by_clients": len(reported), "reported_missing_from_log": len(reported - set(groups)),
        "reported_success_logged_as_success": len(reported_success & success_groups),
        "reported_success": len(reported_success),
        "cut_streams": len(soak.cut_conversations),
        "cut_streams_logged_as_success": len(soak.cut_conversations & success_groups),
        "tools_json_tools": len(registered), "tools_called": len(called),
        "tools_json_never_called": len([n for n in registered if n not in called]),
    }


def run_update(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return {"rc": None, "seconds": round(time.monotonic() - t, 1), "error": "timed out after 1800 s"}
    report = None
    for line in reversed(p.stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            candidate = json.loads(line)
            if isinstance(candidate, dict):
                report = candidate
                break
    stderr = "\n".join(line for line in p.stderr.splitlines() if "it/s]" not in line)  # no progress bars
    return {"rc": p.returncode, "seconds": round(time.monotonic() - t, 1), "report": report,
            "stdout_tail": p.stdout[-2000:], "stderr_tail": stderr[-3000:]}


def analyze_stderr(path: Path) -> dict[str, Any]:
    levels: Counter[str] = Counter()
    events: Counter[str] = Counter()
    raw_lines = tracebacks = 0
    samples: list[str] = []
    seen: set[str] = set()
    lines = 0
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        for line in f:
            lines += 1
            line = line.rstrip("\n")
            try:
                rec = json.loads(line)
                ok = isinstance(rec, dict)
            except ValueError:
                ok = False
            if ok:
                levels[str(rec.get("level"))] += 1
                events[str(rec.get("event"))] += 1
                if rec.get("exc"):
                    tracebacks += 1
                    key = f"{rec.get('event')}: {str(rec.get('exc')).strip().splitlines()[-1][:200]}"
                    if key not in seen and len(samples) < 10:
                        seen.add(key)
                        samples.append(key)
                continue
            if not line.strip() or "it/s]" in line:  # blank, or a progress bar at start-up
                continue
            raw_lines += 1
            if "Traceback (most recent call last)" in line:
                tracebacks += 1
            if re.search(r"(ERROR|Exception|Error:)", line):
                key = line.strip()[:200]
                if key not in seen and len(samples) < 10:
                    seen.add(key)
                    samples.append(key)
    return {"lines": lines, "levels": dict(levels), "events": dict(events), "raw_lines": raw_lines,
            "tracebacks": tracebacks, "samples": samples}


def fit_slope(samples: list[dict], key: str, after: float, scale: float = 1.0) -> float | None:
    """Least-squares slope of ``key`` (divided by ``scale``) per minute over samples at t >= ``after``."""
    pts = [(s["t"] / 60, s[key] / scale) for s in samples if s["t"] >= after and key in s]
    if len(pts) < 3:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


# ---------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------
def brief(report: Any) -> Any:
    """A report with each list cut to its length and first item (the JSON keeps them whole)."""
    if not isinstance(report, dict):
        return report
    return {k: (f"{len(v)} items, first: {str(v[0])[:160]}" if v else "[]") if isinstance(v, list) else v
            for k, v in report.items()}


def counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(c.items())) or "-"


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(res: dict[str, Any]) -> str:
    cfg, m = res["config"], res["machine"]
    out = [f"# Soak of `tracer serve --log`: {cfg['minutes']:g} min, {cfg['clients']} clients\n",
           f"Command: `{res['command']}`  ",
           f"Gateway: `{res['gateway_command']}`  ",
           (f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; load average (1/5/15 min) at start "
            f"{' / '.join(f'{x:.2f}' for x in res['load_start'])}, at end "
            f"{' / '.join(f'{x:.2f}' for x in res['load_end'])}  "),
           (f"Index: `{cfg['scorer']}` on data/example (6 tools), k = {cfg['k']}, sticky cap {res['cap']}; "
            f"each agent carries the 6 indexed tools + {cfg['extra_tools']} of its own; pause "
            f"{cfg['think_ms']:g} ms (x U[0.5, 1.5]); started {res['started']}\n")]
    tot = res["totals"]
    verdict = "PASS" if res["passed"] else "FAIL"
    out.append(f"**{verdict}**: valid requests {tot['valid']['requests']}, errors "
               f"**{tot['valid']['errors']}**, fell back to the whole list **{res['fallbacks']['total']}** "
               f"(at the upstream {res['fallbacks']['at_upstream']}, selection header missing/0 "
               f"{res['fallbacks']['no_selection']}, gateway's tracer_errors{{kind=\"selection\"}} "
               f"{fmt(res['fallbacks']['metrics_selection_errors'], 0)}); hostile "
               f"{tot['hostile']['requests']} (unexpected answers {tot['hostile']['unexpected']}, 5xx "
               f"{tot['hostile']['server_errors']}); disconnects {tot['disconnect']['requests']}; gateway "
               f"{'died at ' + fmt(res['died_at']) + ' s' if res['died_at'] is not None else 'up throughout'}"
               f". Wanted tool presented: {res['want_presented']}.\n")
    out.append("| class | kind | requests | statuses | exceptions | errors / unexpected | fell back | "
               "selection p50 / max (ms) | latency p50 / p99 / max (ms) |")
    out.append("|---|---|---:|---|---|---:|---:|---:|---:|")
    for kind, st in sorted(res["kinds"].items(), key=lambda kv: (kv[1]["class"], kv[0])):
        bad = st["errors"] if st["class"] == VALID else st["unexpected"] if st["class"] == HOSTILE else "-"
        out.append(f"| {st['class']} | {kind} | {st['requests']} | {counts(st['status'])} | "
                   f"{counts(st['exceptions'])} | {bad} | {st['fell_back'] if st['class'] == VALID else '-'} "
                   f"| {fmt(st['selection_ms_p50'], 1)} / {fmt(st['selection_ms_max'], 1)} | "
                   f"{fmt(st['latency_ms_p50'], 0)} / {fmt(st['latency_ms_p99'], 0)} / "
                   f"{fmt(st['latency_ms_max'], 0)} |")
    r = res["resources"]
    out.append(f"\nResources (start = first sample at or after {r['warmup_s']:g} s; slope: least squares "
               f"over the samples from then on, {r['samples_fitted']} samples every {cfg['sample_every']:g} s"
               + ("; a window this short says little about a slope" if not r["slopes_meaningful"] else "")
               + "):\n")
    out.append("| | start | end | max | slope per minute |")
    out.append("|---|---:|---:|---:|---:|")
    for label, key, unit in (("gateway RSS (MB)", "rss_mb", 1), ("log dir (MB)", "log_bytes", MiB),
                             ("gateway .cache (MB)", "cache_bytes", MiB),
                             ("gateway .cache files", "cache_files", 1),
                             ("gateway open fds", "fds", 1), ("gateway threads", "threads", 1)):
        row = r[key]
        out.append(f"| {label} | {fmt(row['start'], 2)} | {fmt(row['end'], 2)} | {fmt(row['max'], 2)} | "
                   f"{fmt(row['slope'], 3)} |")
    h = res["health"]
    out.append(
        f"\nGateway CPU: {fmt(r['cpu_ms_per_request'], 2)} ms per request. `/health` every second: "
        f"{h['probes']} probes, p50 {fmt(h['p50_ms'])} ms, p99 {fmt(h['p99_ms'])} ms, max "
        f"{fmt(h['max_ms'])} ms, {h['over_1s']} over 1 s, {h['failed']} failed. Valid selection "
        f"(`X-Tracer-Selection-Ms`) p50 / p99 / max: {fmt(res['selection_ms']['p50'], 2)} / "
        f"{fmt(res['selection_ms']['p99'], 2)} / {fmt(res['selection_ms']['max'], 2)} ms. Shutdown "
        f"after SIGTERM: {fmt(res['shutdown']['seconds'])} s, exit code {res['shutdown']['rc']}"
        f"{' (uvicorn re-raises the SIGTERM once it has drained)' if res['shutdown']['rc'] == -15 else ''}"
        ".\n")
    stalls = [f"t={t:g} s {ms:.0f} ms" for t, ms, _ in res["health_probes"] if ms > 1000][:10]
    if stalls:
        out.append(f"`/health` over 1 s: {'; '.join(stalls)}. Answers over 1 s: "
                   + ("; ".join(f"t={x['t']:g} s {x['kind']} ({x['tools']} tools) {x['latency_ms']} ms, "
                                f"selection {fmt(x['selection_ms'], 0)} ms" for x in res["slow"][:10])
                      or "none") + ".\n")
    lg = res["log"]
    if lg.get("exists"):
        out.append(f"Conversation log: {lg['lines']} lines, {lg['bytes'] / MiB:.2f} MB "
                   f"({lg['bytes_per_line']} B a line, longest {lg['max_line_bytes']} B); by outcome "
                   f"{counts(lg['by_outcome'])}; unparsable {lg['unparsable_lines']}, non-finite rewards "
                   f"{lg['nonfinite_rewards']}, conversations logged twice "
                   f"{lg['conversations_logged_twice']}; clients reported {lg['reported_by_clients']} "
                   f"({lg['reported_missing_from_log']} missing from the log, "
                   f"{lg['reported_success_logged_as_success']} of {lg['reported_success']} successes logged "
                   "as such); cut streams with `X-Tracer-Outcome: success` logged as a success: "
                   f"{lg['cut_streams_logged_as_success']} of {lg['cut_streams']}; tools.json holds "
                   f"{lg['tools_json_tools']} tools, {lg['tools_json_never_called']} never called.\n")
    else:
        out.append("Conversation log: none written.\n")
    for i, up in enumerate(res["updates"], 1):
        out.append(f"`tracer update` run {i}: exit {up['rc']} in {up['seconds']} s; report "
                   f"`{json.dumps(brief(up.get('report')))}`"
                   + (f"; stderr: `{up.get('stderr_tail', '').strip()[-300:]}`" if up.get("rc") != 0 else "")
                   + "  ")
    ck = res["check"]
    if ck.get("loads"):
        out.append(f"\nUpdated index loads: {ck['tools_before']} -> {ck['tools_after']} tools "
                   f"(new: {', '.join(ck['new_tools'][:10]) or '-'}). Rank of the first wanted tool for a "
                   "probe context, original -> updated:\n")
        out.append("| probe context | wanted | rank | top 3 after |")
        out.append("|---|---|---:|---|")
        for p in ck["probes"]:
            out.append(f"| {p['context']} | {p['want']} | {p['rank_before']} -> {p['rank_after']} | "
                       f"{', '.join(p['top3_after'])} |")
    else:
        out.append(f"\nUpdated index check failed: `{ck.get('error', '')[-500:]}`")
    se = res["stderr"]
    out.append(f"\nGateway stderr (`gateway.stderr.log`, log level {cfg['gateway_log_level']}): "
               f"{se['lines']} lines, levels {counts(se['levels'])}, events {counts(se['events'])}, "
               f"{se['raw_lines']} non-JSON lines, {se['tracebacks']} tracebacks.")
    for s in se["samples"]:
        out.append(f"- `{s}`")
    if res["findings"]:
        out.append("\nFindings:\n")
        out += [f"- {f}" for f in res["findings"]]
    if res["error_samples"]:
        out.append("\nFirst valid errors:\n")
        out += [f"- t={e['t']} {e['kind']} status {e['status']} {e['exception'] or ''}: `{e['detail'][:200]}`"
                for e in res["error_samples"][:10]]
    if res["unexpected_samples"]:
        out.append("\nFirst unexpected answers to hostile requests:\n")
        out += [f"- t={e['t']} {e['kind']} status {e['status']} {e['exception'] or ''}: `{e['detail'][:200]}`"
                for e in res["unexpected_samples"][:10]]
    return "\n".join(out) + "\n"


def findings(res: dict[str, Any]) -> list[str]:
    out = []
    tot, lg = res["totals"], res["log"]
    if tot["valid"]["errors"]:
        out.append(f"{tot['valid']['errors']} valid requests errored")
    if res["fallbacks"]["total"]:
        out.append(f"{res['fallbacks']['total']} valid requests fell back to the whole tool list")
    if tot["hostile"]["server_errors"]:
        out.append(f"{tot['hostile']['server_errors']} hostile requests got a 5xx")
    if res["outside_v1"]:
        out.append(
            f"{res['outside_v1']} requests reached the upstream outside /v1/: {res['outside_paths'][:5]}")
    if res["died_at"] is not None:
        out.append(f"the gateway died at {res['died_at']:.0f} s")
    if res["health"]["over_1s"]:
        out.append(
            f"/health took over 1 s {res['health']['over_1s']} times (max {res['health']['max_ms']:.0f} ms)")
    if lg.get("exists"):
        if lg["nonfinite_rewards"]:
            out.append(f"the log holds {lg['nonfinite_rewards']} non-finite rewards")
        if lg["cut_streams_logged_as_success"]:
            out.append(f"{lg['cut_streams_logged_as_success']} cut streams logged as a success")
        if lg["conversations_logged_twice"]:
            out.append(f"{lg['conversations_logged_twice']} conversations logged more than once")
        if lg["reported_missing_from_log"]:
            out.append(f"{lg['reported_missing_from_log']} reported conversations missing from the log")
        if lg["tools_json_never_called"]:
            out.append(f"tools.json registers {lg['tools_json_never_called']} tools that were never called")
    ups = res["updates"]
    if ups and ups[0].get("rc") != 0:
        out.append(f"`tracer update` on the gateway's log failed (exit {ups[0].get('rc')}): "
                   f"{(ups[0].get('stderr_tail') or '').strip()[-200:]}")
    if len(ups) > 1 and ups[1].get("rc") == 0:
        second = ups[1].get("report") or {}
        again = second.get("applied", second.get("steps"))
        if again:
            out.append(f"the second update applied again: {json.dumps(second)}")
    if not res["check"].get("loads"):
        out.append("the updated index does not load")
    if res["shutdown"]["rc"] not in (0, -15):
        out.append(f"the gateway's exit after SIGTERM: {res['shutdown']['rc']}")
    # flat: what a slope past these would add over an hour is worth a look
    for key, label, limit in (("rss_mb", "gateway RSS (MB)", 1.0),
                              ("cache_bytes", "the gateway's .cache (MB)", 0.5),
                              ("fds", "open fds", 1.0), ("threads", "threads", 1.0)):
        slope = res["resources"][key]["slope"]
        if res["resources"]["slopes_meaningful"] and slope is not None and slope > limit:
            out.append(f"{label} grows by {slope:.3f} per minute after the warm-up")
    if res["stderr"]["tracebacks"]:
        out.append(f"{res['stderr']['tracebacks']} tracebacks in the gateway's stderr")
    return out


# ---------------------------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=("soak", "stub", "build", "check"), default="soak")
    p.add_argument("--port", type=int, default=0, help="(--role stub)")
    p.add_argument("--index", type=Path, default=None, help="(--role build/check) the index directory")
    p.add_argument("--original", type=Path, default=None, help="(--role check) the index before the update")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--think-ms", type=float, default=250.0, help="mean pause of an agent between requests")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-presented", type=int, default=None, help="passed to the gateway (default: its 4 k)")
    p.add_argument("--max-body-bytes", type=int, default=8 * MiB, help="passed to the gateway")
    p.add_argument("--log-idle", type=float, default=120.0,
                   help="passed to the gateway: idle conversations end")
    p.add_argument("--extra-tools", type=int, default=30,
                   help="tools of each agent's own beside the index's 6")
    p.add_argument("--scorer", default="tracer_plus", choices=("tracer_plus", "tracer_fixed", "tracer"))
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=60.0, help="seconds excluded from the slope (a third of a "
                                                               "shorter run)")
    p.add_argument("--max-episodes", type=int, default=100_000, help="per client (a bound beside the time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", type=lambda s: s.split(","), default=None,
                   help="only these episode kinds, comma-separated "
                        "(a check of the script; default: all, weighted)")
    p.add_argument("--gateway-log-level", default="warning")
    p.add_argument("--gateway-arg", action="append", default=[],
                   help="an extra argument for tracer serve (repeat), e.g. --gateway-arg=--no-sticky")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "soak")  # gitignored: no doc quotes it
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (index, log, cache)")
    args = p.parse_args()

    if args.role == "stub":
        import uvicorn

        uvicorn.run(stub_app(), host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                    timeout_keep_alive=75)
        return 0
    if args.role == "build":
        build_index(args.index, args.scorer)
        return 0
    if args.role == "check":
        print(json.dumps(check_index(args.index, args.original)))
        return 0
    if not 0.05 <= args.minutes <= 120 or not 1 <= args.clients <= 256:
        p.error("--minutes in [0.05, 120], --clients in [1, 256]")
    if args.extra_tools > 60:
        p.error("--extra-tools: at most 60")
    if args.kinds and not set(args.kinds) <= set(KINDS):
        p.error(f"--kinds: unknown {sorted(set(args.kinds) - set(KINDS))}; known: {', '.join(KINDS)}")
    return soak(args)


def soak(args: argparse.Namespace) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    module = "tracer" if (ROOT / "tracer" / "__main__.py").exists() else "tracer.cli"
    cli = [sys.executable, "-m", module]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_start = os.getloadavg()
    flags = help_flags([*cli, "serve"], env)  # fails here, before any build, when tracer does not import
    original = cached_index(args.scorer, env)
    work = Path(tempfile.mkdtemp(prefix="soak_gateway_"))
    index, log_dir, gw_cwd = work / "index", work / "log", work / "gateway_cwd"
    shutil.copytree(original, index, symlinks=True)
    gw_cwd.mkdir()
    stub_port, gw_port = free_port(), free_port()
    wanted = {"--port": str(gw_port), "--k": str(args.k), "--log-level": args.gateway_log_level,
              "--max-body-bytes": str(args.max_body_bytes), "--log-idle": str(args.log_idle)}
    if args.max_presented is not None:
        wanted["--max-presented"] = str(args.max_presented)
    gw_cmd = [*cli, "serve", "--index", str(index), "--upstream", f"http://127.0.0.1:{stub_port}/v1",
              "--log", str(log_dir)]
    for flag, value in wanted.items():
        if flag in flags:
            gw_cmd += [flag, value]
    gw_cmd += args.gateway_arg
    stderr_path = args.out / "gateway.stderr.log"
    procs: list[subprocess.Popen] = []

    def stop_all(*_: Any) -> None:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def on_term(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    res: dict[str, Any] = {}
    soak_: Soak | None = None
    try:
        with open(args.out / "stub.stderr.log", "wb") as stub_err:
            procs.append(subprocess.Popen([sys.executable, __file__, "--role", "stub", "--port",
                                           str(stub_port)],
                                          env=env, stdout=stub_err, stderr=subprocess.STDOUT))
        with open(stderr_path, "wb") as gw_err:
            gateway = subprocess.Popen(gw_cmd, env=env, cwd=gw_cwd, stdout=gw_err, stderr=subprocess.STDOUT)
        procs.append(gateway)
        wait_ready(f"http://127.0.0.1:{stub_port}/health", procs[0])
        wait_ready(f"http://127.0.0.1:{gw_port}/health", gateway)
        print(f"gateway up ({' '.join(gw_cmd[1:])}); {args.clients} clients for {args.minutes:g} min",
              flush=True)
        soak_ = Soak(args, gw_port, stub_port, gateway, log_dir, gw_cwd / ".cache")
        asyncio.run(soak_.run())
        stub_view = _stub_records(stub_port)
        metrics_end = soak_.samples[-1].get("metrics", {}) if soak_.samples else {}
        # SIGTERM: the gateway drains and writes its pending conversations
        t = time.monotonic()
        rc = None
        if gateway.poll() is None:
            gateway.send_signal(signal.SIGTERM)
            try:
                rc = gateway.wait(120)
            except subprocess.TimeoutExpired:
                gateway.kill()
                rc = f"killed after 120 s ({gateway.wait(10)})"
        else:
            rc = gateway.returncode
        shutdown = {"seconds": round(time.monotonic() - t, 1), "rc": rc}
        log_report = analyze_log(log_dir, soak_)
        upd = [*cli, "update", "--index", str(index), "--log", str(log_dir)]
        updates = [run_update(upd, env, gw_cwd)]
        updates.append(run_update(upd, env, gw_cwd))
        try:
            ck = subprocess.run([sys.executable, __file__, "--role", "check", "--index", str(index),
                                 "--original", str(original)], check=False, env=env, cwd=gw_cwd,
                                capture_output=True, text=True, timeout=900)
            check = json.loads(ck.stdout.strip().splitlines()[-1]) if ck.returncode == 0 else \
                {"loads": False, "error": ck.stderr[-2000:]}
        except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
            check = {"loads": False, "error": repr(e)}
        res = result(args, soak_, stub_view, metrics_end, shutdown, log_report, updates, check, gw_cmd,
                     started, load_start, stderr_path)
    except KeyboardInterrupt:
        print("interrupted: stopping the gateway and the stub", file=sys.stderr)
        return 130
    finally:
        stop_all()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}", flush=True)
    (args.out / "soak.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = markdown(res)
    (args.out / "soak.md").write_text(md)
    print(md)
    return 0 if res["passed"] else 1


def _stub_records(port: int) -> dict[str, Any]:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/soak/records", timeout=60).json()
    except (httpx.HTTPError, ValueError) as e:
        return {"records": {}, "outside": [], "outside_count": 0, "by_kind": {}, "error": repr(e)}


def result(args, soak_: Soak, stub_view: dict, metrics_end: dict, shutdown: dict, log_report: dict,
           updates: list[dict], check: dict, gw_cmd: list[str], started: str, load_start: tuple,
           stderr_path: Path) -> dict[str, Any]:
    records = stub_view.get("records", {})
    at_upstream = no_selection = 0
    sel_ms: list[float] = []
    fell: set[str] = set()
    for rid, kind, n_tools, sel in soak_.sent:
        got = records.get(rid)
        over = n_tools > soak_.cap and got is not None and got[0] > soak_.cap
        missing_sel = sel is None or sel == 0.0
        at_upstream += over
        no_selection += missing_sel
        if sel is not None:
            sel_ms.append(sel)
        if over or missing_sel:
            fell.add(rid)
            soak_.stat(kind).fell_back += 1
    sel_errors = None
    if metrics_end:
        sel_errors = sum(v
                         for k, v in metrics_end.items() if k.startswith("tracer_errors") and 'selection' in k
                         and not k.endswith("_created"))
    totals = {cls: {"requests": 0, "errors": 0, "unexpected": 0, "server_errors": 0}
              for cls in (VALID, HOSTILE, DISCONNECT)}
    for st in soak_.stats.values():
        for key in ("requests", "errors", "unexpected", "server_errors"):
            totals[st.cls][key] += getattr(st, key)
    samples = soak_.samples
    duration = args.minutes * 60
    warmup = min(args.warmup, duration / 3)
    after = [s for s in samples if s["t"] >= warmup]
    resources: dict[str, Any] = {"warmup_s": warmup, "samples_fitted": len(after),
                                 "slopes_meaningful": duration - warmup >= 180}
    for key, scale in (("rss_mb", 1), ("log_bytes", MiB), ("cache_bytes", MiB), ("cache_files", 1),
                       ("fds", 1), ("threads", 1)):
        vals = [s[key] / scale for s in after if key in s]
        allv = [s[key] / scale for s in samples if key in s]
        resources[key] = {"start": vals[0] if vals else None, "end": vals[-1] if vals else None,
                          "max": max(allv) if allv else None, "slope": fit_slope(samples, key, warmup, scale)}
    cpu = [s for s in samples if "cpu_s" in s]
    n_req = sum(st.requests for st in soak_.stats.values())
    resources["cpu_ms_per_request"] = ((cpu[-1]["cpu_s"] - cpu[0]["cpu_s"]) * 1e3 / max(
        cpu[-1]["requests"] - cpu[0]["requests"], 1)) if len(cpu) > 1 else None
    lat = [ms for _, ms, _ in soak_.health]
    hits = soak_.want_hits
    res: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "gateway_command": " ".join(shlex.quote(str(a)) for a in ["python", *gw_cmd[1:]]),
        "started": started, "machine": machine(), "load_start": list(load_start),
        "load_end": list(os.getloadavg()),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cap": soak_.cap, "requests": n_req,
        "kinds": {k: st.as_dict() for k, st in soak_.stats.items()}, "totals": totals,
        "fallbacks": {"total": len(fell), "at_upstream": at_upstream, "no_selection": no_selection,
                      "metrics_selection_errors": sel_errors, "checked": len(soak_.sent)},
        "selection_ms": {"p50": percentile(sel_ms, 50), "p99": percentile(sel_ms, 99),
                         "max": max(sel_ms) if sel_ms else None},
        "want_presented": (f"{hits['presented'] / max(sum(hits.values()), 1):.1%} of "
                           f"{sum(hits.values())} tool-call turns"),
        "outside_v1": stub_view.get("outside_count", 0), "outside_paths": stub_view.get("outside", [])[:20],
        "stub_by_kind": stub_view.get("by_kind", {}), "stub_error": stub_view.get("error"),
        "extra_answer_headers": dict(soak_.extra_headers_seen),
        "died_at": soak_.died_at, "shutdown": shutdown, "resources": resources,
        "health": {"probes": len(lat), "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
                   "max_ms": max(lat) if lat else None, "over_1s": sum(x > 1000 for x in lat),
                   "failed": sum(1 for _, _, s in soak_.health if s != 200)},
        "log": log_report, "updates": updates, "check": check, "stderr": analyze_stderr(stderr_path),
        "error_samples": soak_.error_samples, "unexpected_samples": soak_.unexpected_samples,
        "slow": soak_.slow, "samples": samples, "health_probes": soak_.health,
    }
    res["findings"] = findings(res)
    res["passed"] = (totals[VALID]["errors"] == 0 and not fell and soak_.died_at is None
                     and totals[VALID]["requests"] > 0)
    return res


if __name__ == "__main__":
    sys.exit(main())
