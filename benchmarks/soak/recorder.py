"""The load generator's state and bookkeeping: :class:`Recorder` holds what the run saw (per-kind
:class:`~benchmarks.soak.stats.Stats`, samples, probes, reported outcomes) and records each request's
answer. :class:`~benchmarks.soak.requester.Requester`, :class:`~benchmarks.soak.agents.Agents` and
:class:`~benchmarks.soak.load.Soak` build on it, each adding one concern."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.soak.constants import MiB
from benchmarks.soak.stats import Stats
from benchmarks.soak.traffic import EXTRA_KINDS, HOSTILE, KINDS, VALID, known_tools, tool_pool


class Recorder:
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
        # (tenant or None, conversation) -> (kind, success) reported by the client
        self.reported: dict[tuple[int | None, str], tuple[str, bool]] = {}
        self.unreported: set[tuple[int | None, str]] = set()
        self.cut_conversations: set[tuple[int | None, str]] = set()
        self.conv_kind: dict[str, str] = {}
        self.conv_counter: dict[int, int] = {}   # tenant -> its last X-Tracer-Conversation number
        self.tokens: dict[int, Any] = {}         # tenant -> its recent (conversation, outcome token)
        self.cross_token_accepted = 0
        self.mcp: Any = None       # benchmarks.soak.mcp_load.McpLoad, with --mcp-clients
        self.mcp_proc: subprocess.Popen | None = None
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
