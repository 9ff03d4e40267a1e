"""What the gateway logs of a chat exchange once its answer has gone out, and when the outcome header applies.

The conversation log (:mod:`tracer.serve.log.sink`) is told each request's messages and, when the answer
carried one, the assistant message: a plain JSON completion's ``choices[0].message`` (:func:`answer_message`),
or the message rebuilt from a streamed answer (:mod:`tracer.serve.log.stream_reply`) whose bytes passed
through untouched while they were read. A compressed answer (``Content-Encoding: gzip`` or ``deflate``)
reaches the client as the upstream sent it; the log reads it decoded, within a cap
(:mod:`tracer.serve.log.content_coding`).

``X-Tracer-Outcome: success|failure`` finishes the conversation only when the answer went out whole: a
200, and for a stream, one the protocol says went out whole (``data: [DONE]`` handed to the client, who may
close its connection right after it, or a finish reason before the upstream's body ended by itself:
:class:`~tracer.serve.log.stream_reply.StreamCopy`). An upstream error, a stream cut before that (by the
client or the upstream), or a body that stopped early leaves the conversation pending with its request
(finished later by the outcome endpoint, or as unreported): the outcome a client announced for a step whose
answer it never got is not evidence of that step.

An outcome that arrives while the conversation's streamed answer is still going out (a client reads
``data: [DONE]`` and posts ``/v1/tracer/outcome`` at once) waits for that stream (:class:`OutcomeGate`):
finishing first would write the record without its last answer, and the stream's end would then open the
conversation again, to be written a second time as unreported.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from tracer.serve.log.content_coding import decode_body
from tracer.serve.log.sink import ConversationLog
from tracer.serve.log.stream_reply import StreamCopy

log = logging.getLogger("tracer.serve")


class OutcomeGate:
    """``finish`` of the conversation log, held back while the conversation has a stream going out.

    Bounded by the streams in flight: an entry lives from a stream's start to its end (:meth:`stream_ended`
    runs when the stream's iterator ends, whole, cut, or closed on a client's disconnect)."""

    def __init__(self, sink: ConversationLog):
        self.sink = sink
        self._lock = threading.Lock()
        self._streams: dict[str, int] = {}
        self._held: dict[str, tuple[bool, float | None]] = {}

    def stream_started(self, conv: str) -> None:
        with self._lock:
            self._streams[conv] = self._streams.get(conv, 0) + 1

    def stream_ended(self, conv: str) -> None:
        with self._lock:
            left = self._streams.pop(conv, 1) - 1
            if left > 0:
                self._streams[conv] = left
                return
            held = self._held.pop(conv, None)
        if held is not None:
            self.sink.finish(conv, *held)

    def finish(self, conv: str, success: bool, reward: float | None = None) -> bool:
        """As :meth:`ConversationLog.finish`; True when held for a stream of the conversation still going
        out."""
        with self._lock:
            if conv in self._streams:
                if self.sink.pending(conv) or conv in self._held:
                    self._held[conv] = (success, reward)
                    return True
                return False
        return self.sink.finish(conv, success, reward)


def answer_message(response: Response, limit: int) -> dict[str, Any] | None:
    """The assistant message of a plain JSON completion (``choices[0].message``, its body decoded when the
    upstream compressed it, within ``limit`` decoded bytes), else None (a stream, an error, another shape)."""
    if isinstance(response, StreamingResponse) or response.status_code != 200:
        return None
    body = decode_body(response.body, response.headers.get("content-encoding"), limit)
    if body is None:
        return None
    try:
        message = orjson.loads(body)["choices"][0]["message"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    return message if isinstance(message, dict) else None


def log_exchange(gate: OutcomeGate, conv: str, body: dict[str, Any], presented: list[str], response: Response,
                 outcome: str | None, max_copy_bytes: int, trial: bool = False) -> None:
    """Log a request and its answer (a streamed one once it has been sent: when its iterator ends).

    Args:
        outcome: the request's ``X-Tracer-Outcome`` header (None when absent).
        max_copy_bytes: the most of an answer decoded to read its message (a stream's, merged).
        trial: the step was presented as a trial's (:meth:`ConversationLog.observe`).
    """
    if isinstance(response, StreamingResponse) and response.status_code == 200:
        _log_stream(gate, conv, body, presented, response, outcome, max_copy_bytes, trial)
        return
    _observe(gate, conv, body, presented, answer_message(response, max_copy_bytes),
             outcome if response.status_code == 200 else None, trial)


def _log_stream(gate: OutcomeGate, conv: str, body: dict[str, Any], presented: list[str],
                response: StreamingResponse, outcome: str | None, max_copy_bytes: int, trial: bool) -> None:
    # the request, whatever comes
    gate.sink.observe(conv, body["messages"], body.get("tools") or [], presented, None, trial)
    copy = StreamCopy(max_copy_bytes, response.headers.get("content-encoding"))

    def ended(whole: bool) -> None:  # on the event loop, as the stream's iterator ends
        try:
            if whole:
                _observe(gate, conv, body, presented, copy.reply(), outcome, trial)
            else:
                log.info("stream cut short; outcome not applied",
                         extra={"event": "stream_cut", "conversation": conv})
        finally:
            gate.stream_ended(conv)
    gate.stream_started(conv)
    response.body_iterator = copy.tee(response.body_iterator, ended)


def _observe(gate: OutcomeGate, conv: str, body: dict[str, Any], presented: list[str], reply: dict | None,
             outcome: str | None, trial: bool) -> None:
    gate.sink.observe(conv, body["messages"], body.get("tools") or [], presented, reply, trial)
    if outcome in ("success", "failure"):
        gate.finish(conv, outcome == "success")
