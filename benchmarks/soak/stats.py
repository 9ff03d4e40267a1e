"""What the load generator counts per episode kind (:class:`Stats`), and the percentile it reports."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


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
