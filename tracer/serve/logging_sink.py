"""Logging conversations for learning (``tracer serve --log DIR``; off by default).

``DIR`` becomes a native dataset directory (``tools.json`` + ``trajectories.jsonl``) that
:func:`tracer.data.load_native` reads and :meth:`Retriever.from_dataset` fits on.

**When a conversation is finished.** A conversation (see :func:`tracer.serve.selection.conversation_id`)
is finished when the caller reports its outcome, either with the header ``X-Tracer-Outcome:
success|failure`` on its last chat request (after that request's answer is seen) or with ``POST
/v1/tracer/outcome {"conversation": ID, "success": true|false, "reward": 1.0}`` (the ID is sent back in
every answer's ``X-Tracer-Conversation`` header); or when it has been idle for ``idle_s`` seconds, or the
gateway shuts down: those are written with ``success: false, reward: 0`` and
``metadata.outcome: "unreported"``, so fitting on successful trajectories (the default) ignores them.

**What is written.** The messages of the conversation's last request plus the assistant message of its
answer: a plain JSON completion's ``choices[0].message``, or, for a streamed answer (SSE), the message
rebuilt from its chunks once the stream has ended (:mod:`tracer.serve.stream_reply`; a stream cut short
adds no reply), ``metadata.called`` (the tools called, in order) and ``metadata.presented``. The
redaction hook (``--redact module:function``, called with the record as a dict; return the record to
write, or None to drop it) runs before anything is written.

**How.** A background thread writes; a request only enqueues. Each record is one ``write`` of one
line on a file opened for appending, then fsync; ``tools.json`` (every tool schema seen, by name) is
replaced atomically before a line that needs a new tool. A line torn by a crash is cut off at start.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracer.core.io import write_json
from tracer.core.steps import iter_calls

log = logging.getLogger("tracer.serve")
Redactor = Callable[[dict[str, Any]], "dict[str, Any] | None"]


def load_callable(spec: str) -> Redactor:
    """``module:function`` -> the function; a clear error naming the argument otherwise."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"--redact {spec!r}: expected module:function")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise TypeError(f"--redact {spec!r}: {module} has no callable {name!r}")
    return fn


class ConversationLog:
    """Pending conversations in memory; finished ones appended by a writer thread."""

    def __init__(self, directory: str | Path, redact: Redactor | None = None, idle_s: float = 600.0,
                 domain: str = "gateway"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "trajectories.jsonl"
        self.redact, self.idle_s, self.domain = redact, idle_s, domain
        self._tools: dict[str, dict] = self._read_tools()
        self._pending: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.written = 0
        self._cut_torn_line()
        self._thread = threading.Thread(target=self._write_loop, name="tracer-log", daemon=True)
        self._thread.start()

    # ---- called by requests (never block on disk) ----------------------------------------------
    def observe(self, conversation: str, messages: Sequence[Mapping], tools: Sequence[Mapping],
                presented: Sequence[str], reply: Mapping | None) -> None:
        """Remember the conversation's latest state (messages, the answer's message, tools seen)."""
        msgs = [dict(m) for m in messages] + ([dict(reply)] if reply else [])
        with self._lock:
            rec = self._pending.setdefault(conversation, {"tools": {}, "presented": []})
            rec["messages"], rec["seen"] = msgs, time.monotonic()
            rec["tools"].update({t["function"]["name"]: dict(t) for t in tools})
            rec["presented"] = list(dict.fromkeys([*rec["presented"], *presented]))

    def finish(self, conversation: str, success: bool, reward: float | None = None,
               outcome: str = "reported") -> bool:
        """Queue the conversation for writing; False if it is unknown (never seen, or already written)."""
        with self._lock:
            rec = self._pending.pop(conversation, None)
        if rec is None:
            return False
        reward = (1.0 if success else 0.0) if reward is None else float(reward)
        self._queue.put({**rec, "conversation": conversation, "success": bool(success), "reward": reward,
                         "outcome": outcome})
        return True

    def sweep(self, now: float | None = None) -> int:
        """Finish conversations idle for ``idle_s`` as unreported; the number finished."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [c for c, r in self._pending.items() if now - r["seen"] >= self.idle_s]
        return sum(self.finish(c, False, 0.0, outcome="unreported") for c in idle)

    def close(self) -> None:
        """Finish everything pending as unreported and wait for the writer."""
        with self._lock:
            pending = list(self._pending)
        for c in pending:
            self.finish(c, False, 0.0, outcome="unreported")
        self._queue.put(None)
        self._thread.join()

    # ---- the writer thread -----------------------------------------------------------------------
    def _write_loop(self) -> None:
        while (rec := self._queue.get()) is not None:
            try:
                self._write(rec)
            except Exception:  # a bad record or a redactor error must not stop the log
                log.exception("conversation not logged", extra={"event": "log_failed",
                                                                 "conversation": rec.get("conversation")})

    def _write(self, rec: dict[str, Any]) -> None:
        called = [name for _, _, name, _ in iter_calls(rec["messages"])]
        record: dict[str, Any] | None = {
            "id": f"{rec['conversation']}-{uuid.uuid4().hex[:8]}", "group": rec["conversation"],
            "domain": self.domain, "messages": rec["messages"], "reward": rec["reward"],
            "success": rec["success"],
            "metadata": {"called": called, "presented": rec["presented"], "outcome": rec["outcome"]}}
        if self.redact is not None:
            record = self.redact(record)
            if record is None:
                return
        new = {n: t for n, t in rec["tools"].items() if n not in self._tools}
        for _, _, name, _ in iter_calls(record["messages"]):  # a call to a tool no request offered
            if name not in self._tools and name not in new:
                new[name] = {"type": "function", "function": {"name": name, "description": "",
                                                              "parameters": {"type": "object", "properties": {}}}}
        if new:
            self._tools.update(new)
            write_json(self.directory / "tools.json", list(self._tools.values()), indent=1)
        line = (json.dumps(record) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(line)
            while view:  # one line, one writer: a short write continues where it stopped
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        self.written += 1

    def _read_tools(self) -> dict[str, dict]:
        path = self.directory / "tools.json"
        if not path.exists():
            return {}
        return {t["function"]["name"]: t for t in json.loads(path.read_text())}

    def _cut_torn_line(self) -> None:
        """A crash during a write can leave a last line without its newline: cut it off (it is ours)."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return
        with open(self.path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
        log.warning("cut a torn last line", extra={"event": "log_repaired", "path": str(self.path)})
