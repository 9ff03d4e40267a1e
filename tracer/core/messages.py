"""OpenAI chat messages: one typed model, and the problems it finds in a conversation, located.

The model (:class:`ChatMessage`, :class:`ToolCall`, :class:`FunctionCall`, :class:`ContentPart`) states the
rules a dataset record obeys (docs/storage.md, "Bad input"):

- ``messages`` is a list of dicts, each with a ``role`` in system/user/assistant/tool.
- A text field (``content``) is a string, ``null``, or a list of OpenAI content parts (dicts with a
  ``type``; a ``text`` part carries a string ``text``, and any other part's ``text``, when it has one, is a
  string too: the context renderer joins them).
- A tool call has ``function.name`` (a non-empty string) and ``function.arguments``: a JSON string
  encoding an object, as OpenAI sends it. An empty string or a missing field reads as no arguments
  (OpenAI-compatible servers send ``""`` for a call without parameters). A dict, a list, a number or
  a JSON string of a non-object is refused: it used to read silently as ``{}``.
- Only an assistant message makes tool calls; a ``tool_calls`` that is empty or null is no calls.
- A tool message answers an earlier call: its ``tool_call_id`` is the ``id`` of a call made before it
  (a rule across messages, checked by the readers, not by the model of one message).
- Strings are valid Unicode: a lone surrogate (which cannot be encoded as UTF-8) is refused with
  its position.

pydantic validates a conversation in one call, in strict mode (no coercion: ``5`` is not a string); what
it refuses comes back from :func:`find_problems` as :class:`Problem` records, each with its place in the
message, a kind (:data:`KINDS`) and the dataset rule's message. The three readers share that verdict and
differ only in what they do with each kind:

- :func:`check_messages` (datasets, strict): the first problem is an :class:`InvalidField` naming the field;
  the dataset reader turns it into a :class:`~tracer.core.errors.DataError` with file, line and record.
- :func:`tracer.core.live.read_live` (live requests, lenient): repairs what it can read, counts each
  repair by kind, refuses the rest.
- :func:`tracer.serve.log.record.normalise` (the gateway's log): repairs or leaves out, so that the
  record it writes passes :func:`check_messages`.

A message the model accepts is passed through by every reader as it is (no copy): the repairs rewrite only
the place a problem names (:func:`tracer.core.message_paths.replace_at`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Discriminator,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    with_config,
)
from pydantic_core import ErrorDetails, PydanticCustomError
from typing_extensions import NotRequired, TypedDict

from tracer.core.message_paths import field_name, valid_unicode
from tracer.core.validate import InvalidField

__all__ = [
    "KINDS",
    "ROLES",
    "ChatMessage",
    "ContentPart",
    "FunctionCall",
    "Problem",
    "ToolCall",
    "as_message_list",
    "check_messages",
    "check_text",
    "find_problems",
]

ROLES = ("system", "user", "assistant", "tool")

# ---- the model ------------------------------------------------------------------------------------------
# TypedDicts, not BaseModels: a message stays the dict it came as (the readers pass it on untouched), and
# pydantic validates a TypedDict without building an object per message and call: on a 10-message
# conversation this is ~1.5x faster than the same model as BaseModels, and the live path runs it per request.
_STRICT = ConfigDict(strict=True, extra="ignore")  # no coercion; keys the model does not name are kept as-is

# A string constraint makes pydantic-core read the string as UTF-8, which refuses a lone surrogate (error
# "string_unicode") in Rust, with no Python call per string; min_length=0 constrains nothing else.
Text = Annotated[str, StringConstraints(min_length=0)]
Name = Annotated[str, StringConstraints(min_length=1)]


def _json_object(s: str) -> str:
    """``s`` if it is empty (no arguments) or JSON encoding an object, in valid Unicode. Checked in this
    order, in Python: arguments that are no JSON object read as none, whatever text they hold."""
    if s == "":
        return s
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        raise PydanticCustomError("arguments_json", "not valid JSON ({reason})", {"reason": e.msg}) from None
    if not isinstance(obj, dict):
        raise PydanticCustomError("arguments_object", "must encode a JSON object, got a {type}",
                                  {"type": type(obj).__name__})
    if valid_unicode(s) is not s:
        raise PydanticCustomError("string_unicode", "not valid Unicode")
    return s


@with_config(_STRICT)
class FunctionCall(TypedDict):
    """The function a tool call names, and its arguments as OpenAI sends them: a JSON string encoding an
    object, or ``""`` / null / missing for none."""

    name: Name
    arguments: NotRequired[Annotated[str, AfterValidator(_json_object)] | None]


@with_config(_STRICT)
class ToolCall(TypedDict):
    """One call of an assistant message; a tool message answers it by its ``id`` (a non-empty string; any
    other value is kept and answered by nothing)."""

    id: NotRequired[Any]
    function: FunctionCall


@with_config(_STRICT)
class TextPart(TypedDict):
    type: Literal["text"]
    text: Text


@with_config(_STRICT)
class OtherPart(TypedDict):
    """An image, audio or file part (or a type this model does not know): left as it is, save ``text``."""

    type: str
    text: NotRequired[Text]


def _part_kind(part: Any) -> str:
    return "text part" if isinstance(part, Mapping) and part.get("type") == "text" else "other part"


ContentPart = Annotated[Annotated[TextPart, Tag("text part")] | Annotated[OtherPart, Tag("other part")],
                        Discriminator(_part_kind)]


@with_config(_STRICT)
class ChatMessage(TypedDict):
    """One message of an OpenAI chat conversation, as a dataset record holds it. That only the assistant
    makes tool calls, and which call a tool message answers, are rules across fields and messages:
    :func:`find_problems` and the readers check them."""

    # OpenAI's roles; a dataset's are four: a developer message, OpenAI's, is found by find_problems, so that
    # a conversation holding one stays on the fast path (no ValidationError raised and read)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: NotRequired[Text | list[ContentPart] | None]
    # not Sequence[ToolCall]: pydantic validates a Sequence with a Python call per message
    tool_calls: NotRequired[list[ToolCall] | tuple[ToolCall, ...] | None]
    tool_call_id: NotRequired[Any]


_MESSAGES = TypeAdapter(list[ChatMessage])
# the model's field names: the other strings in pydantic's error locations are union tags
_FIELDS = frozenset({"role", "content", "tool_calls", "tool_call_id", "id", "function", "name", "arguments",
                     "type", "text"})


# ---- problems -------------------------------------------------------------------------------------------
# what the model refuses, by kind; the readers decide per kind (refuse, repair, leave out)
KINDS = (
    "not_a_message",         # a message that is not a dict
    "role_type",             # a role that is missing or not a string
    "developer_role",        # the role "developer" (OpenAI's current name for a system message)
    "unknown_role",          # another string
    "content_type",          # content that is not a string, null or a list
    "part_not_object",       # a content part that is not a dict
    "part_without_type",     # a content part whose type is missing or not a string
    "text_missing",          # a text part without its text
    "text_type",             # a part's text that is not a string
    "bad_unicode",           # a string holding a lone surrogate
    "misplaced_tool_calls",  # tool calls on a message that is not the assistant's
    "tool_calls_type",       # tool calls that are not a list
    "no_function_name",      # a call without a non-empty string function.name
    "arguments_type",        # arguments that are not a string (an object, a number, ...)
    "arguments_json",        # arguments that are not JSON
    "arguments_object",      # JSON arguments that encode no object
)


@dataclass(frozen=True)
class Problem:
    """What the model refused in one message: ``at`` is its place in the message (``("content", 0,
    "text")``), ``kind`` one of :data:`KINDS`, ``value`` what was found there (None when missing) and
    ``message`` the dataset rule it breaks."""

    at: tuple[str | int, ...]
    kind: str
    value: Any
    message: str


def _type(value: Any) -> str:
    return type(value).__name__


def _role_message(role: Any) -> str:
    return f"must be one of {list(ROLES)}, got {role!r}"


def _surrogate(s: str) -> str:
    """The message naming the first lone surrogate of ``s``."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"lone surrogate {s[e.start]!r} at character {e.start}: not valid Unicode"
    raise ValueError("no lone surrogate")


# the fields whose type is a union: (the container type whose errors are its items', the error of its second
# member when the value fits none): content is Text | list[ContentPart], tool_calls list | tuple of calls
_UNIONS = {"content": (list, "list_type"), "tool_calls": ((list, tuple), "tuple_type")}


def _problem(error: ErrorDetails) -> Problem | None:
    """A pydantic error of one message as a :class:`Problem` (its location without the union tags), or None
    for an error that only says another member of the ``content`` union did not fit."""
    at = tuple(x for x in error["loc"][1:] if isinstance(x, int) or x in _FIELDS)
    err = error["type"]
    value = None if err == "missing" else error["input"]
    field = at[0] if at else None
    if field is None:
        return Problem(at, "not_a_message", value, f"must be a dict, got {_type(value)}")
    if field == "role":
        kind = "unknown_role" if isinstance(value, str) else "role_type"
        return Problem(at, kind, value, _role_message(value))
    if len(at) == 1 and field in _UNIONS:  # one error per member: a list's are its items', one is enough
        fits, second = _UNIONS[field]
        if isinstance(value, fits) or err == second:
            return None
    if err == "string_unicode":
        return Problem(at, "bad_unicode", value, _surrogate(value))
    if field == "content":
        if len(at) == 1:
            return Problem(at, "content_type", value,
                           f"must be a string, null or a list of content parts, got {_type(value)}")
        if len(at) == 2 or at[2] == "type":
            kind = "part_not_object" if len(at) == 2 else "part_without_type"
            return Problem(at[:2], kind, value, "a content part must be an object with a 'type'")
        kind = "text_missing" if err == "missing" else "text_type"
        return Problem(at, kind, value, f"must be a string, got {_type(value)}")
    if field == "tool_calls":
        if len(at) == 1:
            return Problem(at, "tool_calls_type", value, f"must be a list, got {_type(value)}")
        if at[-1] == "arguments":
            if err in ("arguments_json", "arguments_object"):
                return Problem(at, err, value, error["msg"])
            return Problem(at, "arguments_type", value, "must be a JSON string encoding an object (as OpenAI "
                                                        f"sends it), got a {_type(value)}; json.dumps it")
        return Problem((*at[:2], "function", "name"), "no_function_name", value,
                       "tool call without a function name")
    raise AssertionError(f"no problem kind for {error}")  # the model has no other field that can fail


_MISPLACED = "only assistant messages make tool calls"


def find_problems(messages: list[Any]) -> dict[int, list[Problem]]:
    """The problems of each message that breaks a rule of the model (by index, in the message's field
    order); empty for a conversation the model accepts, which costs one validation of the list.

    Two rules are checked here, not by the model: the role ``developer`` (``developer_role``), and tool calls
    on a message that is not the assistant's. ``tool_calls`` that are empty or null are no calls; a list of
    them on another message is one problem, ``misplaced_tool_calls``, whatever the calls hold."""
    developer: set[int] = set()
    misplaced: set[int] = set()
    for j, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") != "assistant":
            if m.get("role") == "developer":
                developer.add(j)
            if m.get("tool_calls") and isinstance(m["tool_calls"], (list, tuple)):
                misplaced.add(j)
    try:
        _MESSAGES.validate_python(messages)
        errors = []
    except ValidationError as e:
        errors = e.errors(include_url=False)
    found: dict[int, list[Problem]] = {}
    for error in errors:
        j = error["loc"][0]
        p = _problem(error)
        if p is None or (p.at[:1] == ("tool_calls",) and (j in misplaced or not messages[j]["tool_calls"])):
            continue  # another union member's error; calls that are misplaced, or none (an empty string)
        found.setdefault(j, []).append(p)
    for j in developer:  # the role comes first
        problem = Problem(("role",), "developer_role", "developer", _role_message("developer"))
        found.setdefault(j, []).insert(0, problem)
    for j in misplaced:  # tool_calls come after role and content
        problem = Problem(("tool_calls",), "misplaced_tool_calls", messages[j]["tool_calls"], _MISPLACED)
        found.setdefault(j, []).append(problem)
    return found


# ---- helpers for the readers ----------------------------------------------------------------------------
def as_message_list(messages: Any) -> list[Any]:
    """``messages`` as a list, or :class:`InvalidField` if it is no sequence of messages."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidField("messages", f"must be a list of message dicts, got {_type(messages)}")
    return messages if isinstance(messages, list) else list(messages)


# ---- the strict reader (datasets) -----------------------------------------------------------------------
def check_text(value: Any, field: str) -> None:
    """A string that encodes as UTF-8 (no lone surrogates), else :class:`InvalidField` naming ``field``."""
    if not isinstance(value, str):
        raise InvalidField(field, f"must be a string, got {_type(value)}")
    if valid_unicode(value) is not value:
        raise InvalidField(field, _surrogate(value))


def check_messages(messages: Any, tool_names: Any = None) -> None:
    """Apply the dataset rules: the first broken one is an :class:`InvalidField` naming its field.
    ``tool_names`` (a container), when given, must hold every called name."""
    messages = as_message_list(messages)
    found = find_problems(messages)
    call_ids: set[str] = set()
    for j, m in enumerate(messages):
        if j in found:
            first = found[j][0]
            raise InvalidField(field_name(j, first.at), first.message)
        for c, call in enumerate(m.get("tool_calls") or ()):
            name = call["function"]["name"]
            if tool_names is not None and name not in tool_names:
                raise InvalidField(field_name(j, ("tool_calls", c, "function", "name")),
                                   f"names {name!r}, which is not in the registry")
            if isinstance(call.get("id"), str) and call["id"]:
                call_ids.add(call["id"])
        if m["role"] == "tool":
            tcid = m.get("tool_call_id")
            if not isinstance(tcid, str) or tcid not in call_ids:
                raise InvalidField(field_name(j, ("tool_call_id",)), f"{tcid!r} answers no earlier tool call "
                                                                     f"(known ids: {sorted(call_ids)[:5]})")
