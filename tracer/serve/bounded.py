"""What the gateway shows of values it did not choose, in its log records and its error messages.

A client's values (a role, a tool name, a conversation id, the text of an exception that quotes them)
may be megabytes and may be user content: each is cut to a bound with a marker that keeps its length
(``rrrr…(2097152 chars)``), so a log line and an error message stay short whatever was sent. A URL is
shown without its userinfo (``http://user:secret@host`` -> ``http://***@host``), so a password in
``--upstream`` reaches neither the log nor a client.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

VALUE_CHARS = 200     # one field of a log record
MESSAGE_CHARS = 1000  # a log record's message, an error message
ITEMS = 50            # elements of a list or dict in a log record
LINE_CHARS = 1000     # one line of a traceback
TRACEBACK_CHARS = 8000  # a whole traceback: its head and, where the exception's message is, its tail


def clip(text: str, limit: int = VALUE_CHARS) -> str:
    """``text`` if at most ``limit`` characters, else its first ``limit`` and ``…(N chars)``."""
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"


def clip_value(value: Any, limit: int = VALUE_CHARS) -> Any:
    """A JSON-ready copy of a log field: strings clipped, containers cut to :data:`ITEMS` elements."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, dict):
        items = list(value.items())
        out = {clip(str(k), limit): clip_value(v, limit) for k, v in items[:ITEMS]}
        if len(items) > ITEMS:
            out["…"] = f"({len(items)} items)"
        return out
    if isinstance(value, (list, tuple)):
        out = [clip_value(v, limit) for v in value[:ITEMS]]
        return out + [f"…({len(value)} items)"] if len(value) > ITEMS else out
    return clip(str(value), limit)


def clip_traceback(text: str) -> str:
    """Each line clipped to :data:`LINE_CHARS`; past :data:`TRACEBACK_CHARS` in all, the middle is cut
    (the head says where it started, the tail holds the exception's message)."""
    text = "\n".join(clip(line, LINE_CHARS) for line in text.split("\n"))
    if len(text) <= TRACEBACK_CHARS:
        return text
    head = TRACEBACK_CHARS // 4
    tail = TRACEBACK_CHARS - head
    return f"{text[:head]}\n…({len(text) - head - tail} chars cut)…\n{text[-tail:]}"


def safe_url(url: str) -> str:
    """``url`` with any userinfo (``user:password@``) replaced by ``***@``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
