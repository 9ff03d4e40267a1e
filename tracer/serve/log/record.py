"""A logged conversation's record, valid by construction: what the dataset loader's strict rules accept.

A live request is not a training record: clients send ``developer`` messages, content that is a number,
arguments that are not JSON, tool messages whose call was trimmed from the history. The gateway forwards
them as they came, but the log is read back by :func:`tracer.data.load_native` and ``tracer update``, so
before a record is written its messages are brought to the rules of the message model
(:mod:`tracer.core.messages`, which names what breaks one):

- a ``developer`` message is a system message; a message that is not an object, or whose role is none of
  system/user/assistant/tool, is left out;
- ``content`` that is not a string, null or a list of content parts is written as its JSON text; a content
  part that is not ``{"type": ...}`` likewise, and a part's ``text`` that is not a string (a text part's
  missing one included);
- a tool call without a function name is left out, and so is ``tool_calls`` on a message that is not the
  assistant's; ``arguments`` given as an object is written as its JSON text; arguments that are not JSON
  encoding an object are written as ``"{}"`` and the raw text is kept in ``metadata.raw_arguments`` (by
  position, ``messages[i].tool_calls[j]``, its first :data:`RAW_CHARS` characters);
- a tool message that answers no earlier call is left out;
- a lone surrogate in a checked string becomes ``?``;
- an image, audio or file content part keeps a placeholder, not its bytes (:func:`without_media`, applied
  as a request is observed, before it is sized or held): ranking reads only text parts, and a screenshot's
  megabyte of base64 would otherwise make a vision conversation too large to log.

What was changed is counted in ``metadata.normalised`` (by rule). :func:`valid_record` applies the same
rules again after the redaction hook, and checks the record's own fields.
"""

from __future__ import annotations

import json
import math
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tracer.core.message_paths import replace_at, valid_unicode, value_at
from tracer.core.messages import Problem, find_problems
from tracer.scorer_base.trial import EXPLORED

RAW_CHARS = 1000
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def _json_text(value: Any) -> str:
    return valid_unicode(json.dumps(value, default=str))


# the field of each media part that carries its bytes (OpenAI chat content parts)
MEDIA_FIELDS = {"image_url": "url", "input_audio": "data", "file": "file_data"}


def _data_size(data: str) -> tuple[str | None, int]:
    """(media type, decoded bytes) of a data: URL or bare base64 text (the size from the base64 length)."""
    media = None
    if data.startswith("data:"):
        head, _, data = data.partition(",")
        media = head[5:].split(";")[0] or None
        if ";base64" not in head:
            return media, len(data)
    n = len(data.rstrip("="))
    return media, n * 3 // 4


def _placeholder(part: Mapping[str, Any]) -> dict[str, Any] | None:
    """A media part without its bytes: ``{"type", <type>: {its other fields}, "omitted": {"media_type",
    "bytes"}}``; None when it carries none (a part of another type, an image by http URL, a file by id)."""
    kind = part.get("type")
    payload = part.get(kind) if isinstance(kind, str) else None
    key = MEDIA_FIELDS.get(kind)
    if key is None or not isinstance(payload, Mapping) or not isinstance(payload.get(key), str):
        return None
    data = payload[key]
    if kind != "input_audio" and not data.startswith("data:"):
        return None  # a reference (an image's URL), not the bytes
    media, size = _data_size(data)
    if kind == "input_audio":
        fmt = payload.get("format")
        media = f"audio/{fmt}" if isinstance(fmt, str) else "audio"
    rest = {k: v for k, v in payload.items() if k != key}
    return {**part, kind: rest, "omitted": {"media_type": media or "application/octet-stream", "bytes": size}}


def without_media(messages: Sequence[Any]) -> list[Any]:
    """``messages`` with each media part that carries bytes (a data: URL image, audio, a file's data) replaced
    by its placeholder (:func:`_placeholder`); a message without one is passed through as it is."""
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list):
            parts = [(_placeholder(p) if isinstance(p, Mapping) else None) or p for p in content]
            if any(p is not q for p, q in zip(parts, content)):
                m = {**m, "content": parts}
        out.append(m)
    return out


def normalise(messages: Sequence[Any]) -> tuple[list[dict], Counter, dict[str, str]]:
    """(messages under the loader's rules, what was changed by rule, raw arguments replaced by position).

    The message model (:mod:`tracer.core.messages`) names what breaks a rule; each problem is repaired or its
    message or call left out (module docstring), a message the model accepts is copied as it is."""
    messages = list(messages)
    found = find_problems(messages)
    out: list[dict] = []
    fixes: Counter = Counter()
    raw: dict[str, str] = {}
    call_ids: set[str] = set()
    for j, m in enumerate(messages):
        m, raw_by_call = _repaired(m, found.get(j, ()), fixes)
        if m is None:
            fixes["message_dropped"] += 1
            continue
        if m["role"] == "tool" and not (isinstance(m.get("tool_call_id"), str)
                                        and m["tool_call_id"] in call_ids):
            fixes["orphan_tool_message_dropped"] += 1
            continue
        call_ids.update(c["id"] for c in m.get("tool_calls", ()) if isinstance(c.get("id"), str) and c["id"])
        for c, text in raw_by_call.items():  # keyed by the call's position in what is written
            raw[f"messages[{len(out)}].tool_calls[{c}]"] = text
        out.append(m)
    return out, fixes, raw


_LEFT_OUT = object()  # a repair's answer for a call or a tool_calls field that is not written


def _repaired(m: Any, problems: Sequence[Problem], fixes: Counter) -> tuple[dict | None, dict[int, str]]:
    """(message ``m`` under the loader's rules, or None when it is left out; the raw text of the arguments
    replaced by ``"{}"``, by the call's position among those written)."""
    raw: dict[int, str] = {}
    rewritten: list[tuple] = []  # places rewritten whole: the problems inside one are gone with it
    for p in problems:
        if any(p.at[:len(place)] == place for place in rewritten):
            continue
        if p.kind in ("not_a_message", "role_type", "unknown_role"):
            return None, {}
        if p.kind == "no_function_name":  # the call is left out whole
            fixes["call_dropped"] += 1
            place, value = p.at[:2], _LEFT_OUT
        else:
            place, value = p.at, _repair(p, value_at(m, p.at), fixes, raw)
        m = replace_at(m, place, value)
        rewritten.append(place)
    m = dict(m)
    if isinstance(m.get("content"), list):
        m["content"] = [dict(part) for part in m["content"]]
        omitted = sum(isinstance(part.get("omitted"), Mapping) for part in m["content"])
        if omitted:
            fixes["media_omitted"] += omitted
    calls = m.pop("tool_calls", None)
    if calls is _LEFT_OUT:
        return m, {}
    if calls:
        kept = [(c, call) for c, call in enumerate(calls) if call is not _LEFT_OUT]
        m["tool_calls"] = [_written_call(call) for _, call in kept]
        raw = {new: raw[old] for new, (old, _) in enumerate(kept) if old in raw}
    return m, raw


def _written_call(call: Mapping[str, Any]) -> dict:
    """A copy of ``call`` whose function has its ``arguments`` field (null when it had none)."""
    fn = call["function"]
    return {**call, "function": {**fn, "arguments": fn.get("arguments")}}


def _repair(p: Problem, value: Any, fixes: Counter, raw: dict[int, str]) -> Any:
    """What is written where problem ``p`` was found (``value``), each change counted by rule."""
    kind = p.kind
    if kind == "developer_role":
        fixes["developer_as_system"] += 1
        return "system"
    if kind == "bad_unicode":
        return valid_unicode(value)
    if kind == "content_type":
        fixes["content_as_text"] += 1
        return _json_text(value)
    if kind in ("part_not_object", "part_without_type"):
        fixes["content_part_as_text"] += 1
        return {"type": "text", "text": _json_text(value)}
    if kind in ("text_missing", "text_type"):
        fixes["content_part_as_text"] += 1
        return _json_text(value)
    if kind in ("misplaced_tool_calls", "tool_calls_type"):
        fixes["tool_calls_dropped"] += 1
        return _LEFT_OUT
    if kind == "arguments_type" and isinstance(value, Mapping):
        fixes["arguments_object_as_text"] += 1
        return _json_text(value)
    # arguments_type (not an object), arguments_json, arguments_object: "{}", the raw text kept
    fixes["arguments_replaced"] += 1
    raw[p.at[1]] = (valid_unicode(value) if isinstance(value, str) else _json_text(value))[:RAW_CHARS]
    return "{}"


def called_names(messages: Sequence[Any]) -> Iterator[str]:
    """The names of the tool calls in (possibly malformed) messages, in order."""
    for m in messages:
        if isinstance(m, Mapping) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            for c in m["tool_calls"]:
                fn = c.get("function") if isinstance(c, Mapping) else None
                if isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and fn["name"]:
                    yield valid_unicode(fn["name"])


def tool_schema(name: str, offered: Any = None) -> dict:
    """The tools.json entry of a called tool: the schema a request offered for it (its description and
    parameters when they have the right types), else a placeholder with no description."""
    fn = offered.get("function") if isinstance(offered, Mapping) else None
    fn = fn if isinstance(fn, Mapping) else {}
    desc = fn.get("description")
    params = fn.get("parameters")
    return {"type": "function",
            "function": {"name": name, "description": valid_unicode(desc) if isinstance(desc, str) else "",
                         "parameters": params if isinstance(params, dict) else EMPTY_PARAMETERS}}


def build_record(conversation: str, messages: Sequence[Any], presented: Sequence[str], success: bool,
                 reward: float, outcome: str, domain: str, unoffered: Sequence[str] = (),
                 explored: bool = False) -> dict[str, Any]:
    """The record of a finished conversation; its ``id`` is unique (a random 64-bit suffix), since the
    index's ledger learns each id once (:mod:`tracer.core.applied`). ``unoffered``: the tools it calls that
    no request of the conversation offered (a model's invented name; ``tracer update`` does not learn
    them). ``explored``: a trial conversation, every step of it presented as a trial's; written as
    ``metadata.explored: true`` (:data:`tracer.scorer_base.trial.EXPLORED`), the mark the loader keeps in the
    trajectory's metadata and a refit reads. Other records have no such field."""
    msgs, fixes, raw = normalise(messages)
    group = valid_unicode(conversation) if conversation.strip() else "-"
    meta: dict[str, Any] = {"called": list(called_names(msgs)), "presented": list(presented),
                            "outcome": outcome}
    if fixes:
        meta["normalised"] = dict(fixes)
    if raw:
        meta["raw_arguments"] = raw
    if unoffered:
        meta["unoffered"] = list(unoffered)
    if explored:
        meta[EXPLORED] = True
    return {"id": f"{group}-{uuid.uuid4().hex[:16]}", "group": group, "domain": domain, "messages": msgs,
            "reward": reward, "success": success, "metadata": meta}


class InvalidRecord(ValueError):
    """A record the redaction hook returned that breaks the loader's rules beyond repair."""


def _record_problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return f"record: expected an object, got {type(record).__name__}"
    for key in ("id", "group", "domain"):
        if not isinstance(record.get(key), str) or (key != "domain" and not record[key].strip()):
            return f"{key}: must be a non-empty string"
    reward = record.get("reward", 1.0)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return f"reward: must be a finite number, got {reward!r}"
    for key, typ, what in (("messages", list, "a list"), ("success", bool, "true or false"),
                           ("metadata", dict, "an object")):
        if (key == "messages" or record.get(key) is not None) and not isinstance(record.get(key), typ):
            return f"{key}: must be {what}"
    return None


def valid_record(record: Any) -> dict[str, Any]:
    """``record`` (as the redaction hook returned it) under the loader's rules, or :class:`InvalidRecord`
    naming the field."""
    problem = _record_problem(record)
    if problem is not None:
        raise InvalidRecord(problem)
    msgs, fixes, _ = normalise(record["messages"])
    out = {**record, "id": valid_unicode(record["id"]), "group": valid_unicode(record["group"]),
           "messages": msgs}
    if fixes:
        out["metadata"] = {**(record.get("metadata") or {}), "normalised_after_redaction": dict(fixes)}
    return out
