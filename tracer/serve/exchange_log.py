"""What the gateway logs of a chat exchange once its answer has gone out, and when the outcome header applies.

The conversation log (:mod:`tracer.serve.logging_sink`) is told each request's messages and, when the answer
carried one, the assistant message: a plain JSON completion's ``choices[0].message``, or the message rebuilt
from a streamed answer (:mod:`tracer.serve.stream_reply`) whose bytes passed through untouched while a copy
was kept.

``X-Tracer-Outcome: success|failure`` finishes the conversation only when the answer went out whole: a
200, and for a stream, one that ended by itself and said it was done (a finish reason or ``data: [DONE]``).
An upstream error, a stream the client or the upstream cut, or a body that stopped early leaves the
conversation pending with its request (finished later by the outcome endpoint, or as unreported): the
outcome a client announced for a step whose answer it never got is not evidence of that step.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from tracer.serve.conversations import reply_message
from tracer.serve.logging_sink import ConversationLog
from tracer.serve.stream_reply import StreamCopy

log = logging.getLogger("tracer.serve")


def log_exchange(sink: ConversationLog, conv: str, body: dict[str, Any], presented: list[str], response: Response,
                 outcome: str | None, max_copy_bytes: int) -> None:
    """Log a request and its answer (a streamed one once it has been sent: a background task of ``response``).

    Args:
        outcome: the request's ``X-Tracer-Outcome`` header (None when absent).
        max_copy_bytes: the most of a streamed answer copied to rebuild its message.
    """
    if isinstance(response, StreamingResponse) and response.status_code == 200:
        _log_stream(sink, conv, body, presented, response, outcome, max_copy_bytes)
        return
    _observe(sink, conv, body, presented, reply_message(response), outcome if response.status_code == 200 else None)


def _log_stream(sink: ConversationLog, conv: str, body: dict[str, Any], presented: list[str],
                response: StreamingResponse, outcome: str | None, max_copy_bytes: int) -> None:
    sink.observe(conv, body["messages"], body.get("tools") or [], presented, None)  # the request, whatever comes
    copy = StreamCopy(max_copy_bytes)
    compressed = "content-encoding" in response.headers

    def cut() -> None:
        log.info("stream cut short; outcome not applied", extra={"event": "stream_cut", "conversation": conv})
    response.body_iterator = copy.tee(response.body_iterator, cut)

    async def after() -> None:  # on the event loop (a sync task would take a thread for a short parse)
        if not copy.complete:
            return
        if compressed or copy.finished():
            _observe(sink, conv, body, presented, None if compressed else copy.reply(), outcome)
        else:
            cut()
    response.background = BackgroundTask(after)


def _observe(sink: ConversationLog, conv: str, body: dict[str, Any], presented: list[str], reply: dict | None,
             outcome: str | None) -> None:
    sink.observe(conv, body["messages"], body.get("tools") or [], presented, reply)
    if outcome in ("success", "failure"):
        sink.finish(conv, outcome == "success")
