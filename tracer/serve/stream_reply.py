"""The assistant message of a streamed (SSE) answer, rebuilt for the conversation log.

The gateway passes a streamed answer through byte for byte. When conversations are logged it keeps a
copy of those bytes (:class:`StreamCopy`) and, once the answer has been sent, rebuilds the message the
client assembled (:func:`assemble_reply`), so the tool calls of streamed answers reach the trajectory.

The merge rule is the one the official ``openai`` client applies to ``chat.completion.chunk`` events
(``ChatCompletionStreamState``): each ``choices[0].delta`` is merged into the message; strings are
concatenated (``content``, and each tool call's ``id``, ``function.name`` and ``function.arguments``
fragments), tool calls are matched by their ``index``, ``role`` and ``type`` are replaced, not
concatenated. Only the ``data:`` field of each event is read; ``data: [DONE]`` ends the stream, and an
event that is not JSON (a comment, a keep-alive) is skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import orjson

_REPLACED = frozenset(("type", "role"))


def sse_data(stream: bytes) -> Iterator[bytes]:
    """The ``data`` of each complete event (lines joined by newlines), as the SSE spec dispatches them."""
    data: list[bytes] = []
    for line in stream.splitlines():
        if not line:  # a blank line ends the event
            if data:
                yield b"\n".join(data)
            data = []
        elif line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)


def _merge(acc: dict[str, Any], delta: Mapping[str, Any]) -> None:
    for key, value in delta.items():
        old = acc.get(key)
        if isinstance(value, list):
            acc[key] = _merge_indexed(old if isinstance(old, list) else [], value)
        elif old is None or key in _REPLACED:
            acc[key] = dict(value) if isinstance(value, Mapping) else value
        elif isinstance(old, str) and isinstance(value, str):
            acc[key] = old + value
        elif isinstance(old, dict) and isinstance(value, Mapping):
            _merge(old, value)
        elif value is not None:
            acc[key] = value


def _merge_indexed(acc: list[dict[str, Any]], items: list[Any]) -> list[dict[str, Any]]:
    """Merge list items (tool calls) into ``acc`` by their ``index`` (their position when they have none)."""
    for position, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        index = item.get("index")
        if not isinstance(index, int) or isinstance(index, bool):  # a malformed index: its position, so the
            index = position                                         # rebuilt list stays sortable
        target = next((a for a in acc if a.get("index", None) == index), None)
        if target is None:
            target = {"index": index}
            acc.append(target)
        _merge(target, {k: v for k, v in item.items() if k != "index"})
    return acc


def assemble_reply(stream: bytes) -> dict[str, Any] | None:
    """The assistant message of choice 0 of a streamed chat completion; None when no delta came."""
    message: dict[str, Any] = {}
    for data in sse_data(stream):
        if data == b"[DONE]":
            break
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        for choice in (chunk.get("choices") or []) if isinstance(chunk, dict) else []:
            if (isinstance(choice, dict) and choice.get("index", 0) == 0
                    and isinstance(choice.get("delta"), dict)):
                _merge(message, choice["delta"])
    if not message:
        return None
    calls = sorted(message.pop("tool_calls", None) or [], key=lambda c: c["index"])
    for call in calls:
        del call["index"]
        call.setdefault("type", "function")
    return {"role": "assistant", **message, "content": message.get("content"),
            **({"tool_calls": calls} if calls else {})}


def stream_finished(stream: bytes) -> bool:
    """Whether a streamed chat completion said it was done: a ``data: [DONE]`` event, or a finish reason on
    choice 0 (a server may end without ``[DONE]``). A body that merely stopped (a close-delimited answer
    whose upstream died) has neither."""
    for data in sse_data(stream):
        if data == b"[DONE]":
            return True
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        for choice in (chunk.get("choices") or []) if isinstance(chunk, dict) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0 and choice.get("finish_reason"):
                return True
    return False


class StreamCopy:
    """Passes a streamed body through unchanged while keeping a copy of its bytes (up to ``limit``)."""

    TAIL = 64  # bytes kept past the limit: enough to see the closing ``data: [DONE]``

    def __init__(self, limit: int):
        self.limit = limit
        self.parts: list[bytes] = []
        self.tail = b""
        self.size = 0
        self.complete = False  # the source ended by itself (not cut by the client or an upstream error)

    async def tee(self, source: AsyncIterator[bytes], on_end: Callable[[bool], None]) -> AsyncIterator[bytes]:
        """``source``'s chunks as they come; ``on_end(complete)`` runs when the iterator ends: complete when
        ``source`` was exhausted, not when the stream was cut or closed before its end."""
        try:
            async for chunk in source:
                self.size += len(chunk)
                if self.size <= self.limit:
                    self.parts.append(chunk)
                else:
                    self.tail = (self.tail + chunk)[-self.TAIL:]
                yield chunk
            self.complete = True
        finally:
            on_end(self.complete)

    def finished(self) -> bool:
        """The stream ended by itself and said it was done (:func:`stream_finished`; past ``limit``, a
        ``[DONE]`` at its end)."""
        if not self.complete:
            return False
        if self.size > self.limit:
            return b"[DONE]" in self.tail
        return stream_finished(b"".join(self.parts))

    def reply(self) -> dict[str, Any] | None:
        """The rebuilt assistant message of a stream that reached its end within ``limit``, else None."""
        if not self.complete or self.size > self.limit:
            return None
        return assemble_reply(b"".join(self.parts))
