"""Places inside an OpenAI chat message, as the message model's problems name them (``at``: a path of keys
and indices such as ``("tool_calls", 0, "function", "name")``): its field name in an error, the value there, a
copy with another value there, and a string made valid UTF-8. The readers of :mod:`tracer.core.messages`
repair and report with these; they know nothing of the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def field_name(j: int, at: tuple[str | int, ...]) -> str:
    """The field at ``at`` of message ``j``: ``messages[2].tool_calls[0].function.name``."""
    return f"messages[{j}]" + "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in at)


def value_at(obj: Any, at: tuple[str | int, ...]) -> Any:
    """The value at ``at`` (None where a key is missing, or where a step meets no dict or list)."""
    for x in at:
        if isinstance(obj, Mapping):
            obj = obj.get(x)
        elif isinstance(obj, (list, tuple)) and isinstance(x, int):
            obj = obj[x]
        else:
            return None
    return obj


def replace_at(obj: Any, at: tuple[str | int, ...], value: Any) -> Any:
    """A copy of ``obj`` with ``value`` at ``at``: only the dicts and lists on the way are copied (the rest is
    shared), a dict keeps its key order."""
    if not at:
        return value
    head, rest = at[0], at[1:]
    if isinstance(obj, Mapping):
        return {**obj, head: replace_at(obj.get(head), rest, value)}
    out = list(obj)
    out[head] = replace_at(out[head], rest, value)
    return out


def valid_unicode(s: str) -> str:
    """``s`` itself when it encodes as UTF-8, else a copy with each lone surrogate replaced by ``?``."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return s.encode("utf-8", "replace").decode("utf-8")
    return s
