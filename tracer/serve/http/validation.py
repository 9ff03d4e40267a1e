"""Checking a chat-completions request at the edge: a malformed one is a 400 naming the field.

Only what the gateway reads is checked (``messages``, ``tools`` and an ``allowed_tools`` ``tool_choice``);
everything else is the upstream's business and is forwarded untouched.

**Lone-surrogate escapes.** JavaScript's ``JSON.stringify`` writes a string holding half of a surrogate pair
(an emoji sliced by ``substring``) as the escape ``\\ud83c``. That is valid JSON syntax, upstreams accept it,
and orjson refuses it ("no low surrogate"). Such a body is read by the standard library's parser instead
(counted as the leniency ``surrogate_escape``; ``NaN`` and ``Infinity`` still refused), ranked leniently
(:mod:`tracer.core.live`: ``bad_unicode``) and forwarded with the same escapes (:func:`dump_body`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import orjson
from starlette.responses import JSONResponse

from tracer.core.validate import InvalidField
from tracer.serve.bounded import MESSAGE_CHARS, clip
from tracer.serve.selection import allowed_names

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def openai_error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """An error answer in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status)


class RequestError(ValueError):
    """A request the gateway refuses; ``param`` names the field (OpenAI's ``error.param``)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        # a message may quote the client's value (a 2 MB tool name): bounded here, once for every error
        super().__init__(clip(f"{param}: {message}" if param else message, MESSAGE_CHARS))
        self.param, self.status = param, status


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise RequestError("must be a non-empty array of messages", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError("each message must be an object with a string role", f"messages[{i}].role")
        calls = m.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise RequestError("must be an array", f"messages[{i}].tool_calls")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RequestError("each tool call needs function.name",
                                   f"messages[{i}].tool_calls[{j}].function.name")


def _check_tools(tools: Any) -> list[str]:
    """The tools' names, in order."""
    if not isinstance(tools, list):
        raise RequestError("must be an array of tool objects", "tools")
    seen: dict[str, int] = {}
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict):
            raise RequestError("expected {'type': 'function', 'function': {...}}", f"tools[{i}].function")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError("missing or empty tool name", f"tools[{i}].function.name")
        if name in seen:
            raise RequestError(f"duplicate tool name (first at tools[{seen[name]}]): {name!r}",
                               f"tools[{i}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):  # ranked, logged and sent on as a schema
            raise RequestError(f"must be a JSON Schema object, got {type(params).__name__}",
                               f"tools[{i}].function.parameters")
        seen[name] = i
    return list(seen)


# a conversation id keys the sticky lists, the pending log and the outcome tokens: bounded, printable
MAX_CONVERSATION_ID = 256


def check_conversation_id(value: str | None, where: str) -> str | None:
    """``value`` if it is a usable conversation id (1-256 printable ASCII characters) or None; else
    RequestError."""
    if value is None:
        return None
    if not 0 < len(value) <= MAX_CONVERSATION_ID or not value.isascii() or not value.isprintable():
        raise RequestError(f"a conversation id is 1 to {MAX_CONVERSATION_ID} printable ASCII characters "
                           f"(got {len(value)} characters)", where)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(raw: bytes, lenient: Counter[str]) -> Any:
    try:
        return orjson.loads(raw)  # a 128-tool BFCL request is ~68 KB; orjson takes about half json's time
    except orjson.JSONDecodeError as e:
        error = RequestError(f"body is not valid JSON ({e})")
        if not _SURROGATE_ESCAPE.search(raw):
            raise error from None
    try:  # a lone-surrogate escape: valid JSON that orjson refuses (module docstring)
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise error from None
    lenient["surrogate_escape"] += 1
    return body


def parse_chat_request(raw: bytes, lenient: Counter[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The request body as a dict and its tools' names (in order), or :class:`RequestError` naming the
    first bad field. ``lenient`` counts what was read leniently (kind -> count)."""
    body = _loads(raw, Counter() if lenient is None else lenient)
    if not isinstance(body, dict):
        raise RequestError("body must be a JSON object")
    _check_messages(body.get("messages"))
    try:
        allowed_names(body.get("tool_choice"))
    except InvalidField as e:
        raise RequestError(e.problem, e.field) from None
    tools = body.get("tools")
    return body, [] if tools is None else _check_tools(tools)


def dump_body(body: Any) -> bytes:
    """The JSON bytes of a request to forward. orjson cannot write a string holding a lone surrogate (a body
    read leniently): the standard library's encoder writes that one, with the escape it came as
    (``\\ud83c``) and the rest of its non-ASCII text as escapes too, the same JSON values."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
