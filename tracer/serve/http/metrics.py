"""Prometheus metrics of the gateway and structured (JSON lines) logs.

Each gateway owns its own :class:`prometheus_client.CollectorRegistry`, so two gateways in one process
(tests) do not share counters; ``GET /metrics`` renders it in the text exposition format.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

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
        self.unknown_tools = Counter("tracer_unknown_tools", "Request tools the index does not know, "
                                     "by fate: embedded now, or over_cap (--max-unknown-embed; ranked last)",
                                     ["fate"], registry=self.registry)
        self.conversations = Counter("tracer_conversations", "Chat requests by how their conversation was "
                                     "found: header, continued, new", ["how"], registry=self.registry)
        self.outcome_ignored = Counter("tracer_outcome_ignored", "X-Tracer-Outcome headers not applied, by "
                                       "reason: invalid, logging_off, status", ["reason"],
                                       registry=self.registry)

    def watch_log(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        """Export the conversation log's own accounting (:meth:`ConversationLog.stats`) at each scrape."""
        self.registry.register(_LogCollector(stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LogCollector(Collector):
    """``tracer_log_*``: what ``--log`` holds, has written and has dropped (by reason), read at scrape
    time."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        yield GaugeMetricFamily("tracer_log_pending", "Unfinished conversations held", value=s["pending"])
        yield GaugeMetricFamily("tracer_log_pending_bytes", "JSON bytes of the unfinished conversations held",
                                value=s["pending_bytes"])
        yield GaugeMetricFamily("tracer_log_queued_bytes",
                                "JSON bytes of finished records awaiting the writer", value=s["queued_bytes"])
        yield GaugeMetricFamily("tracer_log_bytes", "Bytes of the log files on disk", value=s["log_bytes"])
        yield CounterMetricFamily("tracer_log_written", "Conversations written to the log",
                                  value=s["written"])
        dropped = CounterMetricFamily("tracer_log_dropped", "Conversations not logged, by reason",
                                      labels=["reason"])
        for reason, n in sorted(s["dropped"].items()):
            dropped.add_metric([reason], n)
        yield dropped


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
    """Send the ``tracer.serve`` logger's records, and uvicorn's own (``uvicorn.error``: start-up, shutdown,
    an exception in a stream the upstream broke), to stderr as bounded JSON lines; run uvicorn with
    ``log_config=None`` so it keeps them."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    for name in ("tracer.serve", "uvicorn.error"):
        logger = logging.getLogger(name)
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
