"""Reading a live conversation leniently: what an agent sends is ranked, never refused for being untidy.

A dataset record must obey every rule of :mod:`tracer.core.validate` (it becomes training data). A live
request is not training data: an agent sends what its framework produced, and refusing to rank it makes a
gateway fall back to the whole tool list. :func:`read_live` turns such a conversation into the decision step
at its end, applying these leniencies (each counted under its kind):

- ``developer_role``: a ``developer`` message (OpenAI's current name for it) is a system message.
- ``unknown_role``: another role (``function``, ...) is kept as context text and opens no turn.
- ``content_type``: content that is not a string, null or a list of parts is read as text (``5`` reads
  ``"5"``, an object as its JSON); a bare string part is a text part; a non-string ``text`` is its JSON.
- ``bad_unicode``: a lone surrogate in a text is replaced (``?``): it cannot reach a tokenizer as UTF-8.
- ``bad_arguments``: ``arguments`` that are not a JSON string encoding an object: an object is serialised,
  anything else (a truncated string, a list, a number) reads as no arguments (``"{}"``).
- ``unknown_tool_call``: a call of a tool the index does not know (another agent's, one the request offered
  but the index was not trained with) stays in the rendered context and is no step of the trie's prefix.
- ``orphan_tool_message``: a tool message whose call is not in the history (trimmed by the agent) is context.
- ``misplaced_tool_calls``: ``tool_calls`` on a message that is not the assistant's are dropped.

What no reading can repair is still refused with :class:`~tracer.core.validate.InvalidField` naming the field:
``messages`` not a list, a message not a dict, a role that is not a string, ``tool_calls`` not a list, a call
without a string ``function.name``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracer.core.steps import step_from_messages
from tracer.core.types import Message, Step
from tracer.core.validate import ROLES, InvalidField

LENIENCIES = ("developer_role", "unknown_role", "content_type", "bad_unicode", "bad_arguments",
              "unknown_tool_call", "orphan_tool_message", "misplaced_tool_calls")


@dataclass(frozen=True)
class LiveStep:
    """The decision step of a live conversation and the leniencies its reading applied (kind -> count)."""

    step: Step
    lenient: Mapping[str, int]


def read_live(messages: Any, known: Container[str]) -> LiveStep:
    """The step at the end of ``messages``; ``known``: the index's tool names (the only ones in the prefix).

    Messages that need no leniency are passed through as they are (no copy)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidField("messages", f"must be a list of message dicts, got {type(messages).__name__}")
    counts: Counter[str] = Counter()
    call_ids: set[str] = set()
    out = [_message(m, f"messages[{j}]", known, call_ids, counts) for j, m in enumerate(messages)]
    return LiveStep(step_from_messages(out, known=known), dict(counts))


def _message(m: Any, at: str, known: Container[str], call_ids: set[str], counts: Counter[str]) -> Message:
    if not isinstance(m, Mapping):
        raise InvalidField(at, f"must be a dict, got {type(m).__name__}")
    role = m.get("role")
    if not isinstance(role, str):
        raise InvalidField(f"{at}.role", f"must be a string, got {type(role).__name__}")
    fixed: dict[str, Any] = {}
    if role == "developer":
        role = fixed["role"] = "system"
        counts["developer_role"] += 1
    elif role not in ROLES:
        counts["unknown_role"] += 1
    content = _content(m.get("content"), counts)
    if content is not m.get("content"):
        fixed["content"] = content
    calls = m.get("tool_calls")
    if calls:
        if not isinstance(calls, (list, tuple)):
            raise InvalidField(f"{at}.tool_calls", f"must be a list, got {type(calls).__name__}")
        if role != "assistant":
            counts["misplaced_tool_calls"] += 1
            fixed["tool_calls"] = None
        else:
            read = [_call(c, f"{at}.tool_calls[{i}]", known, counts) for i, c in enumerate(calls)]
            call_ids.update(c["id"] for c in read if isinstance(c.get("id"), str) and c["id"])
            if any(r is not c for r, c in zip(read, calls)):
                fixed["tool_calls"] = read
    if role == "tool" and m.get("tool_call_id") not in call_ids:
        counts["orphan_tool_message"] += 1
    return {**m, **fixed} if fixed else m


def _call(call: Any, at: str, known: Container[str], counts: Counter[str]) -> Mapping[str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise InvalidField(f"{at}.function.name", "tool call without a function name")
    name = _text(fn["name"], counts)
    if name not in known:
        counts["unknown_tool_call"] += 1
    args = fn.get("arguments")
    fixed_args = _arguments(args, counts)
    if name is fn["name"] and fixed_args is args:
        return call
    return {**call, "function": {**fn, "name": name, "arguments": fixed_args}}


def _arguments(args: Any, counts: Counter[str]) -> Any:
    if args is None or args == "":
        return args
    if isinstance(args, str):
        try:
            if isinstance(json.loads(args), dict):
                return _text(args, counts)
        except ValueError:
            pass
    counts["bad_arguments"] += 1
    if isinstance(args, Mapping):
        return json.dumps(args, default=str)
    return "{}"


def _content(content: Any, counts: Counter[str]) -> Any:
    if content is None:
        return None
    if isinstance(content, str):
        return _text(content, counts)
    if not isinstance(content, list):
        counts["content_type"] += 1
        return _text(json.dumps(content, default=str, ensure_ascii=False), counts)
    parts = [_part(p, counts) for p in content]
    return content if all(p is q for p, q in zip(parts, content)) else parts


def _part(part: Any, counts: Counter[str]) -> Any:
    if isinstance(part, str):
        counts["content_type"] += 1
        return {"type": "text", "text": _text(part, counts)}
    if not isinstance(part, Mapping):
        counts["content_type"] += 1
        return {"type": "text", "text": _text(json.dumps(part, default=str, ensure_ascii=False), counts)}
    if "text" not in part:  # an image, audio, ...: not text, left as it is
        return part
    text = part["text"]
    if isinstance(text, str):
        clean = _text(text, counts)
        return part if clean is text else {**part, "text": clean}
    counts["content_type"] += 1
    return {**part, "text": "" if text is None else _text(json.dumps(text, default=str, ensure_ascii=False),
                                                          counts)}


def _text(s: str, counts: Counter[str]) -> str:
    """``s`` itself when it encodes as UTF-8, else a copy with each lone surrogate replaced by ``?``."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        counts["bad_unicode"] += 1
        return s.encode("utf-8", "replace").decode("utf-8")
    return s
