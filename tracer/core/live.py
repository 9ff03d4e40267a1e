"""Reading a live conversation leniently: what an agent sends is ranked, never refused for being untidy.

A dataset record must obey every rule of the message model (:mod:`tracer.core.messages`: it becomes training
data). A live request is not training data: an agent sends what its framework produced, and refusing to rank
it makes a gateway fall back to the whole tool list. :func:`read_live` turns such a conversation into the
decision step at its end. It asks the model what breaks a rule (:func:`~tracer.core.messages.find_problems`)
and repairs each problem it can read, counting the repair under its kind:

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

A content part without a ``type`` (or a text part without its text) is left as it is: the renderer reads
only the text it has. What no reading can repair is still refused with
:class:`~tracer.core.validate.InvalidField` naming the field: ``messages`` not a list, a message not a dict,
a role that is not a string, ``tool_calls`` not a list, a call without a string ``function.name``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

from tracer.core.message_paths import field_name, replace_at, valid_unicode, value_at
from tracer.core.messages import Problem, as_message_list, find_problems
from tracer.core.steps import step_from_messages
from tracer.core.types import Message, Step
from tracer.core.validate import InvalidField

LENIENCIES = ("developer_role", "unknown_role", "content_type", "bad_unicode", "bad_arguments",
              "unknown_tool_call", "orphan_tool_message", "misplaced_tool_calls")
_REFUSED = ("not_a_message", "role_type", "tool_calls_type", "no_function_name")  # no reading repairs them


@dataclass(frozen=True)
class LiveStep:
    """The decision step of a live conversation and the leniencies its reading applied (kind -> count)."""

    step: Step
    lenient: Mapping[str, int]


def read_live(messages: Any, known: Container[str]) -> LiveStep:
    """The step at the end of ``messages``; ``known``: the index's tool names (the only ones in the prefix).

    Messages that need no leniency are passed through as they are (no copy)."""
    messages = as_message_list(messages)
    counts: Counter[str] = Counter()
    found = find_problems(messages)
    out = [_repaired(m, j, found[j], counts) if j in found else m for j, m in enumerate(messages)]
    call_ids: set[str] = set()
    for m in out:
        if m["role"] == "assistant":
            for call in m.get("tool_calls") or ():
                if call["function"]["name"] not in known:
                    counts["unknown_tool_call"] += 1
                if isinstance(call.get("id"), str) and call["id"]:
                    call_ids.add(call["id"])
        elif m["role"] == "tool" and not (isinstance(m.get("tool_call_id"), str)
                                          and m["tool_call_id"] in call_ids):
            counts["orphan_tool_message"] += 1
    return LiveStep(step_from_messages(out, known=known), dict(counts))


def _repaired(m: Any, j: int, problems: list[Problem], counts: Counter[str]) -> Message:
    """Message ``j`` with its ``problems`` repaired (the places they name rewritten), or InvalidField."""
    for p in problems:
        if p.kind == "role_type":  # any string is read as a role (another one opens no turn)
            raise InvalidField(field_name(j, p.at), f"must be a string, got {type(p.value).__name__}")
        if p.kind in _REFUSED:
            raise InvalidField(field_name(j, p.at), p.message)
    rewritten: list[tuple] = []  # places rewritten whole: the problems inside one are gone with it
    for p in problems:
        if any(p.at[:len(place)] == place for place in rewritten):
            continue
        value = _repair(p.kind, value_at(m, p.at), counts)
        if value is not _AS_IT_IS:
            m = replace_at(m, p.at, value)
            rewritten.append(p.at)
    return m


_AS_IT_IS = object()  # what a repair returns for a problem the live reading accepts as it is


def _repair(kind: str, value: Any, counts: Counter[str]) -> Any:
    """The live reading of ``value``, found where a problem of ``kind`` is; each leniency counted."""
    if kind == "developer_role":
        counts["developer_role"] += 1
        return "system"
    if kind == "unknown_role":
        counts["unknown_role"] += 1
        return _AS_IT_IS
    if kind == "misplaced_tool_calls":
        counts["misplaced_tool_calls"] += 1
        return None
    if kind == "bad_unicode":
        counts["bad_unicode"] += 1
        return valid_unicode(value)
    if kind == "content_type":
        counts["content_type"] += 1
        return _as_text(value, counts)
    if kind == "part_not_object":  # a bare string is a text part; anything else, its JSON
        counts["content_type"] += 1
        text = _counted(value, counts) if isinstance(value, str) else _as_text(value, counts)
        return {"type": "text", "text": text}
    if kind == "text_type":
        counts["content_type"] += 1
        return "" if value is None else _as_text(value, counts)
    if kind in ("arguments_type", "arguments_json", "arguments_object"):
        counts["bad_arguments"] += 1
        return json.dumps(value, default=str) if isinstance(value, Mapping) else "{}"
    return _AS_IT_IS  # part_without_type, text_missing: the renderer reads only the text a part has


def _as_text(value: Any, counts: Counter[str]) -> str:
    return _counted(json.dumps(value, default=str, ensure_ascii=False), counts)


def _counted(s: str, counts: Counter[str]) -> str:
    """``s`` as valid Unicode, a replacement counted as ``bad_unicode``."""
    clean = valid_unicode(s)
    if clean is not s:
        counts["bad_unicode"] += 1
    return clean
