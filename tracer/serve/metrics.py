"""Prometheus metrics of the gateway and structured (JSON lines) logs.

Each gateway owns its own :class:`prometheus_client.CollectorRegistry`, so two gateways in one process
(tests) do not share counters; ``GET /metrics`` renders it in the text exposition format.
"""

from __future__ import annotations

import json
import logging
import time
from typing import ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tracer.serve.bounded import MESSAGE_CHARS, clip, clip_traceback, clip_value

# seconds; selection is sub-millisecond to tens of ms, the upstream up to minutes
_FAST = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
_SLOW = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("tracer_requests", "Chat-completion requests answered, by HTTP status",
                                ["status"], registry=self.registry)
        self.errors = Counter("tracer_errors", "Requests that failed in the gateway, by kind",
                              ["kind"], registry=self.registry)
        self.selection = Histogram("tracer_selection_seconds", "Time to choose the presented tools",
                                   buckets=_FAST, registry=self.registry)
        self.upstream = Histogram("tracer_upstream_seconds", "Upstream time to response headers",
                                  buckets=_SLOW, registry=self.registry)
        self.reloads = Counter("tracer_index_reloads", "Index reloads", registry=self.registry)
        self.lenient = Counter("tracer_lenient", "Leniencies applied reading a live conversation "
                               "(tracer.core.live), by kind", ["kind"], registry=self.registry)
        self.unknown_tools = Counter("tracer_unknown_tools", "Request tools the index does not know, by fate: "
                                     "embedded now, or over_cap (--max-unknown-embed; ranked last)",
                                     ["fate"], registry=self.registry)
        self.conversations = Counter("tracer_conversations", "Chat requests by how their conversation was "
                                     "found: header, continued, new", ["how"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, message and the record's ``extra`` fields."""

    _PLAIN: ClassVar[frozenset[str]] = frozenset(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        """Every field bounded (:mod:`tracer.serve.bounded`): a client's value never makes a long line."""
        out = {"ts": round(record.created, 6), "level": record.levelname.lower(), "logger": record.name,
               "msg": clip(record.getMessage(), MESSAGE_CHARS)}
        out.update({k: clip_value(v) for k, v in vars(record).items()
                    if k not in self._PLAIN and k != "message"})
        if record.exc_info:
            out["exc"] = clip_traceback(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


def setup_json_logging(level: str = "info") -> None:
    """Send the ``tracer.serve`` logger's records to stderr as JSON lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tracer.serve")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self) -> Stopwatch:  # noqa: PYI034
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
