"""The assistant message of a streamed (SSE) answer, rebuilt for the conversation log, and whether the answer
went out whole.

The gateway passes a streamed answer through byte for byte. When conversations are logged it reads a copy of
those bytes as they go out (:class:`StreamCopy`): decoded when the upstream compressed them
(:mod:`tracer.serve.log.content_coding`), split into events (:class:`SseEvents`) and merged into the message
the client assembles (:class:`ReplyBuilder`), so the tool calls of streamed answers reach the trajectory.

The merge rule is the one the official ``openai`` client applies to ``chat.completion.chunk`` events
(``ChatCompletionStreamState``): each ``choices[0].delta`` is merged into the message; strings are
concatenated (``content``, and each tool call's ``id``, ``function.name`` and ``function.arguments``
fragments), tool calls are matched by their ``index``, ``role`` and ``type`` are replaced, not
concatenated. Only the ``data:`` field of each event is read; ``data: [DONE]`` ends the stream, and an
event that is not JSON (a comment, a keep-alive) is skipped.

**When a stream went out whole** is decided by the protocol, not by the client's connection: the official
client closes its connection as soon as it has read ``data: [DONE]``, often before the upstream's body (and
so the gateway's answer) has ended, and that is a whole answer. A stream is whole when the ``[DONE]`` event
was handed to the client, or when the upstream's body ended by itself after a finish reason on choice 0 (a
server that sends no ``[DONE]``). A stream cut before either (the client or the upstream gone mid-answer) is
not.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson

from tracer.serve.log.content_coding import BodyDecoder

_REPLACED = frozenset(("type", "role"))
_LINE_END = re.compile(rb"\r\n|\r|\n")


class SseEvents:
    """Server-sent events split incrementally: :meth:`feed` bytes as they come, get the ``data`` of each event
    completed (its lines joined by newlines), as the SSE spec dispatches them; an event not ended by a blank
    line is never dispatched.

    Bounded: an event whose data (or a line) passes ``max_event`` bytes is skipped whole; each byte is
    copied a bounded number of times, however the stream is cut into chunks."""

    def __init__(self, max_event: int):
        self.max_event = max_event
        self._rest = bytearray()    # the unfinished line
        self._data: list[bytes] = []
        self._size = 0
        self._skip = False          # the current event is over ``max_event``
        self._after_cr = False      # the last byte fed was a CR (a line end, maybe half a CRLF)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of the events ``chunk`` completes."""
        if self._after_cr and chunk.startswith(b"\n"):  # the second half of a CRLF split between chunks
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        *lines, tail = _LINE_END.split(chunk)
        out: list[bytes] = []
        for i, line in enumerate(lines):
            if i == 0 and self._rest:
                line = bytes(self._rest) + line
                self._rest.clear()
            self._line(line, out)
        self._rest += tail
        if len(self._rest) > self.max_event:  # a line too long to keep: its event is skipped
            self._rest.clear()
            self._data, self._skip = [], True
        return out

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if not line:  # a blank line ends the event
            if self._data and not self._skip:
                out.append(b"\n".join(self._data))
            self._data, self._size, self._skip = [], 0, False
        elif line.startswith(b"data:") and not self._skip:
            value = line[5:]
            value = value[1:] if value.startswith(b" ") else value
            self._size += len(value) + 1
            if self._size > self.max_event:
                self._data, self._skip = [], True
            else:
                self._data.append(value)


def sse_data(stream: bytes) -> list[bytes]:
    """The ``data`` of each complete event of a whole stream."""
    return SseEvents(len(stream) + 1).feed(stream)


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


class ReplyBuilder:
    """The assistant message of choice 0 merged event by event (:meth:`add` each event's ``data``), and how
    the stream said it ended: :attr:`done` (``data: [DONE]``), :attr:`finish_reason` (on choice 0).

    Args:
        limit: event bytes merged at most; past it the message is not rebuilt (:meth:`reply` is None), the
            end is still followed.
    """

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.merged = 0
        self.message: dict[str, Any] = {}
        self.done = False
        self.finish_reason = False

    @property
    def too_long(self) -> bool:
        return self.limit is not None and self.merged > self.limit

    def add(self, data: bytes) -> None:
        if self.done:  # nothing after [DONE] belongs to the answer
            return
        if data == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        for choice in (chunk.get("choices") or []) if isinstance(chunk, dict) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = True
            if isinstance(choice.get("delta"), dict):
                self.merged += len(data)
                if not self.too_long:
                    _merge(self.message, choice["delta"])

    def reply(self) -> dict[str, Any] | None:
        """The message as the client assembled it; None when no delta came or it passed ``limit``."""
        if not self.message or self.too_long:
            return None
        message = {k: v for k, v in self.message.items() if k != "tool_calls"}
        calls = sorted((dict(c) for c in self.message.get("tool_calls") or []), key=lambda c: c["index"])
        for call in calls:
            del call["index"]
            call.setdefault("type", "function")
        return {"role": "assistant", **message, "content": message.get("content"),
                **({"tool_calls": calls} if calls else {})}


def assemble_reply(stream: bytes) -> dict[str, Any] | None:
    """The assistant message of choice 0 of a whole streamed chat completion; None when no delta came."""
    builder = ReplyBuilder()
    for data in sse_data(stream):
        builder.add(data)
    return builder.reply()


class StreamCopy:
    """Passes a streamed body through unchanged while reading what the client was handed (see the module
    docstring): decoded when the upstream compressed it (its ``Content-Encoding``), at most ``limit`` bytes of
    it merged into the message."""

    def __init__(self, limit: int, encoding: str | None = None):
        self.limit = limit
        self.decoder = BodyDecoder(encoding, limit)
        self.events = SseEvents(limit)
        self.builder = ReplyBuilder(limit)
        self.size = 0           # bytes handed to the client
        self.complete = False   # the source ended by itself (not cut by the client or an upstream error)

    async def tee(self, source: AsyncIterator[bytes], on_end: Callable[[bool], None]) -> AsyncIterator[bytes]:
        """``source``'s chunks as they come; ``on_end(whole)`` runs when the iterator ends (:meth:`finished`:
        whether the answer went out whole), also when the stream was cut or closed before its end."""
        try:
            async for chunk in source:
                yield chunk
                # the server came back for the next chunk: this one was handed to the client
                self._read(chunk)
            self.complete = True
        finally:
            on_end(self.finished())

    def _read(self, chunk: bytes) -> None:
        self.size += len(chunk)
        for data in self.events.feed(self.decoder.feed(chunk)):
            self.builder.add(data)

    def finished(self) -> bool:
        """The answer went out whole: ``[DONE]`` was handed to the client, or the source ended by itself
        after a finish reason on choice 0. A compressed stream decoded past ``limit`` (or in a coding not
        decoded here) cannot be read to its end: there, the source ending by itself."""
        if self.builder.done:
            return True
        if not self.complete:
            return False
        return self.builder.finish_reason or self.decoder.over or not self.decoder.supported

    def reply(self) -> dict[str, Any] | None:
        """The rebuilt assistant message of a stream that went out whole, decoded and within ``limit``; else
        None."""
        if not self.finished() or self.decoder.stopped:
            return None
        return self.builder.reply()
