"""Logging conversations for learning (``tracer serve --log DIR``; off by default).

``DIR`` becomes a native dataset directory (``tools.json`` + ``trajectories.jsonl``, and the segments it
rotated: :mod:`tracer.serve.log.files`) that :func:`tracer.data.load_native` reads and ``tracer update``
learns from.

**When a conversation is finished.** A conversation (its id: :mod:`tracer.serve.conversations`)
is finished when the caller reports its outcome, either with the header ``X-Tracer-Outcome:
success|failure`` on its last chat request (applied once that request's answer has been sent whole: an
upstream error or a stream cut short leaves the conversation pending) or with ``POST /v1/tracer/outcome``
(:mod:`tracer.serve.http.admin`); or when it has been idle for ``idle_s`` seconds, or the gateway shuts down:
those are written with ``success: false, reward: 0`` and ``metadata.outcome: "unreported"``, so fitting on
successful trajectories (the default) ignores them.

**What is written.** The messages of the conversation's last request plus the assistant message of its
answer (a plain JSON completion's ``choices[0].message``, or the message rebuilt from a stream that ended:
:mod:`tracer.serve.log.stream_reply`), ``metadata.called`` (the tools called, in order) and
``metadata.presented`` (an image, audio or file part as a placeholder with its media type and size, not its
bytes), brought to the loader's rules first (:mod:`tracer.serve.log.record`: what is
written is valid by construction). A trial conversation (:mod:`tracer.scorer_base.trial`) is written with
``metadata.explored: true``, which ``tracer update`` reads as the trajectory's mark, only when every step the
record holds was presented as a trial's: its first request seen held no tool call yet (a conversation the
log took up midway, after an eviction, a restart or on another replica, holds steps it did not see
presented), and every request since was a trial step. A conversation that became a trial midway (a reload
gave the index a second ranking to try) is not marked: its earlier steps showed one ranking only, and
counting them as trial steps would tilt the comparison toward it. ``tools.json`` holds only the tools some
written record calls, with the schema a request offered for it (a placeholder without description when none
did: a name the model invented, listed in the record's ``metadata.unoffered``, which ``tracer update`` does
not learn). The redaction hook (``--redact module:function``, called with the record as a dict; return the
record to write, or None to drop it) runs before anything is written.

**Caps** (:class:`LogLimits`, each a ``tracer serve`` flag). Pending conversations are held as the JSON of
their messages: at most ``max_pending`` of them and ``max_pending_bytes`` in all; over either, the least
recently seen is dropped (a client sends the whole history with each request, so a conversation that goes
on is whole again at its next request). A conversation whose record would exceed ``max_record_bytes`` is
not held (nor written). Finished records wait for the writer within another ``max_pending_bytes`` (over it,
a finished conversation is dropped). The files stay within ``max_bytes`` (:mod:`tracer.serve.log.files`).
Every drop is counted in :attr:`ConversationLog.dropped` by reason (``evicted``, ``oversized``,
``backlog``, ``log_full``, ``invalid``) and logged (at most once per reason every 10 s).

**How.** A background thread writes; a request only enqueues.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import operator
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tracer.core.lru import LRU
from tracer.serve.conversations import conversation_id
from tracer.serve.log.files import LogFiles
from tracer.serve.log.record import build_record, called_names, tool_schema, valid_record, without_media

log = logging.getLogger("tracer.serve")
Redactor = Callable[[dict[str, Any]], "dict[str, Any] | None"]
BATCH = 256        # records written per fsync
WARN_EVERY_S = 10.0


def load_callable(spec: str) -> Redactor:
    """``module:function`` -> the function; a clear error naming the argument otherwise."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"--redact {spec!r}: expected module:function")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise TypeError(f"--redact {spec!r}: {module} has no callable {name!r}")
    return fn


@dataclass(frozen=True)
class LogLimits:
    """The log's caps. Each is the ``tracer serve`` flag ``--log-`` + its name with dashes, its help in the
    field's metadata (:mod:`tracer.cli.options`)."""

    max_pending: int = field(default=10_000, metadata={"help": (
        "unfinished conversations held; over it the least recently seen is dropped")})
    max_pending_bytes: int = field(default=128 << 20, metadata={"help": (
        "their JSON in all (128 MiB); also the bound on records waiting for the writer")})
    max_record_bytes: int = field(default=1 << 20, metadata={"help": (
        "a larger conversation is neither held nor written (1 MiB)")})
    max_bytes: int = field(default=1 << 30, metadata={"help": (
        "the log directory's files in all (1 GiB); records past it are dropped and counted")})
    segment_bytes: int = field(default=64 << 20, metadata={"help": (
        "trajectories.jsonl is rotated into trajectories-NNNNNN.jsonl past this (64 MiB)")})

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--log-{name.replace('_', '-')} {value!r}: must be a positive integer")
        if self.max_record_bytes > min(self.max_pending_bytes, self.segment_bytes, self.max_bytes):
            raise ValueError(f"--log-max-record-bytes {self.max_record_bytes}: must not exceed "
                             "--log-max-pending-bytes, --log-segment-bytes or --log-max-bytes")
        if self.segment_bytes > self.max_bytes:
            raise ValueError(f"--log-segment-bytes {self.segment_bytes}: must not exceed --log-max-bytes")


@dataclass(slots=True)
class _Pending:
    messages: bytes                   # the JSON of the latest messages (the answer's message included)
    tools: dict[str, Any]             # name -> the schema a request offered, for the tools called so far
    presented: list[str]
    seen: float
    size: int
    explored: bool = False            # every step it holds was presented as a trial's


@dataclass(slots=True)
class _Finished:
    conversation: str
    rec: _Pending
    success: bool
    reward: float
    outcome: str


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:  # an integer past 64 bits or a lone surrogate (json.loads of an answer reads both)
        return json.dumps(obj, default=str).encode()


def _reward(success: bool, reward: float | None) -> float:
    """The reward to write; a non-finite one is a ValueError (the loader refuses it, and so would update)."""
    if reward is None:
        return 1.0 if success else 0.0
    try:
        value = float(reward)
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if isinstance(reward, bool) or not math.isfinite(value):
        raise ValueError(f"reward must be a finite number, got {reward!r}")
    return value


class ConversationLog:
    """Pending conversations in memory, within :class:`LogLimits`; finished ones appended by a writer
    thread."""

    def __init__(self, directory: str | Path, redact: Redactor | None = None, idle_s: float = 600.0,
                 domain: str = "gateway", limits: LogLimits | None = None):
        self.limits = limits or LogLimits()
        self.files = LogFiles(directory, self.limits.max_bytes, self.limits.segment_bytes)
        self.directory, self.path = self.files.directory, self.files.active
        self.redact, self.idle_s, self.domain = redact, idle_s, domain
        # conversation -> its pending record, popped and set again at each request, so iterated least
        # recently seen first (tracer.core.lru); over either cap the least recently seen is evicted
        self._pending = LRU(self.limits.max_pending_bytes, getsizeof=operator.attrgetter("size"),
                            max_items=self.limits.max_pending,
                            on_evict=lambda conversation, rec: self._drop("evicted", conversation, rec.size))
        self.queued_bytes = 0
        self.written = 0
        self.dropped: Counter[str] = Counter()
        self._warned: dict[str, float] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Finished | None] = queue.Queue()
        self._thread = threading.Thread(target=self._write_loop, name="tracer-log", daemon=True)
        self._thread.start()

    @property
    def pending_bytes(self) -> int:
        """What the pending records hold (their JSON bytes, the cap's measure)."""
        return self._pending.currsize

    def stats(self) -> dict[str, Any]:
        """What the log holds and has dropped (its own accounting: JSON bytes, not the process's memory)."""
        with self._lock:
            return {"pending": len(self._pending), "pending_bytes": self.pending_bytes,
                    "queued_bytes": self.queued_bytes, "written": self.written, "log_bytes": self.files.size,
                    "dropped": dict(self.dropped)}

    # ---- called by requests (never block on disk) ----------------------------------------------
    def observe(self, conversation: str, messages: Sequence[Mapping], tools: Sequence[Mapping],
                presented: Sequence[str], reply: Mapping | None, trial: bool = False) -> None:
        """Remember the conversation's latest state (messages, the answer's message, the called tools'
        schemas). ``trial``: this step was presented as a trial's (the record's ``metadata.explored``: the
        module docstring)."""
        # a conversation first seen with tool calls in its history holds steps this log did not see presented
        fresh = trial and next(called_names(messages), None) is None
        msgs = without_media([*messages, {"role": "assistant", **reply}] if reply else messages)
        body = _dumps(msgs)
        names = list(dict.fromkeys(called_names(msgs)))
        wanted = set(names)
        offered = {t["function"]["name"]: t for t in tools if t["function"]["name"] in wanted}
        with self._lock:
            old = self._pending.pop(conversation, None)
            schemas = {n: offered.get(n) or (old.tools.get(n) if old else None) for n in names}
            shown = list(dict.fromkeys([*(old.presented if old else ()), *presented]))
            size = (len(body) + sum(len(_dumps(s)) for s in schemas.values() if s)
                    + sum(len(p) + 3 for p in shown))
            if size > self.limits.max_record_bytes:
                self._drop("oversized", conversation, size)
                return
            explored = trial and old.explored if old else fresh
            self._pending[conversation] = _Pending(body, schemas, shown, time.monotonic(), size, explored)

    def pending(self, conversation: str) -> bool:
        with self._lock:
            return conversation in self._pending

    def finish(self, conversation: str, success: bool, reward: float | None = None,
               outcome: str = "reported") -> bool:
        """Queue the conversation for writing; False if it is unknown (never seen, already written, or
        dropped by a cap). A reward that is not a finite number is a ValueError (nothing changes)."""
        value = _reward(success, reward)
        with self._lock:
            rec = self._pending.pop(conversation, None)
            if rec is None:
                return False
            if self.queued_bytes + rec.size > self.limits.max_pending_bytes:
                self._drop("backlog", conversation, rec.size)
                return False
            self.queued_bytes += rec.size
        self._queue.put(_Finished(conversation, rec, bool(success), value, outcome))
        return True

    def sweep(self, now: float | None = None) -> int:
        """Finish conversations idle for ``idle_s`` as unreported; the number finished."""
        now = time.monotonic() if now is None else now
        idle = []
        with self._lock:
            for c, r in self._pending.items():  # least recently seen first: stop at the first still active
                if now - r.seen < self.idle_s:
                    break
                idle.append(c)
        return sum(self.finish(c, False, 0.0, outcome="unreported") for c in idle)

    def close(self) -> None:
        """Finish everything pending as unreported and wait for the writer."""
        with self._lock:
            pending = list(self._pending)
        for c in pending:
            self.finish(c, False, 0.0, outcome="unreported")
        self._queue.put(None)
        self._thread.join()

    def _drop(self, reason: str, conversation: str, size: int) -> None:
        """Count a conversation not logged (the caller holds the lock or is the writer)."""
        self.dropped[reason] += 1
        now = time.monotonic()
        if now - self._warned.get(reason, -math.inf) >= WARN_EVERY_S:
            self._warned[reason] = now
            log.warning("conversation not logged", extra={"event": "log_dropped", "reason": reason,
                                                          "bytes": size, "conversation": conversation,
                                                          "dropped_total": self.dropped[reason]})

    # ---- the writer thread -----------------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while batch[-1] is not None and len(batch) < BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write([f for f in batch if f is not None])
            except Exception:  # a disk error must not stop the log
                log.exception("conversations not logged",
                              extra={"event": "log_failed", "records": len(batch)})
            if batch[-1] is None:
                return

    def _write(self, batch: list[_Finished]) -> None:
        lines, owners = [], []
        for f in batch:
            with self._lock:
                self.queued_bytes -= f.rec.size
            try:
                line = self._line(f)
            except Exception:  # a redactor's error or what it returned: this record only
                log.exception("conversation not logged",
                              extra={"event": "log_failed", "conversation": f.conversation})
                with self._lock:
                    self._drop("invalid", f.conversation, f.rec.size)
                continue
            if line is None:
                continue
            if len(line[0]) > self.limits.max_record_bytes:
                with self._lock:
                    self._drop("oversized", f.conversation, len(line[0]))
                continue
            lines.append(line)
            owners.append(f)
        for f, ok in zip(owners, self.files.write(lines)):
            with self._lock:
                if ok:
                    self.written += 1
                else:
                    self._drop("log_full", f.conversation, f.rec.size)

    def _line(self, f: _Finished) -> tuple[bytes, dict[str, dict]] | None:
        """(the record's line, the tools.json entries of the tools it calls); None when redacted away."""
        unoffered = [n for n, schema in f.rec.tools.items() if schema is None]
        group = conversation_id(f.conversation)  # the id the client knows, without its tenant
        record: dict[str, Any] | None = build_record(group, json.loads(f.rec.messages),
                                                     f.rec.presented, f.success, f.reward, f.outcome,
                                                     self.domain, unoffered, f.rec.explored)
        if self.redact is not None:
            record = self.redact(record)
            if record is None:
                return None
        record = valid_record(record)
        calls = {n: tool_schema(n, f.rec.tools.get(n))
                 for n in dict.fromkeys(called_names(record["messages"]))}
        return (json.dumps(record) + "\n").encode(), calls
