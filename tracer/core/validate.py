"""Validation at the edge: the rules every public entry point applies to its inputs, in one place.

The rules (docs/storage.md, "Bad input"):

- ``k`` is an ``int >= 1`` (``bool`` is refused); a ``k`` larger than the registry presents the
  whole registry.
- ``messages`` is a list of dicts, each with a ``role`` in system/user/assistant/tool.
- A text field (``content``) is a string, ``null``, or a list of OpenAI content parts (dicts with a
  ``type``; a ``text`` part carries a string ``text``).
- A tool call has ``function.name`` (a non-empty string) and ``function.arguments``: a JSON string
  encoding an object, as OpenAI sends it. An empty string or a missing field reads as no arguments
  (OpenAI-compatible servers send ``""`` for a call without parameters). A dict, a list, a number or
  a JSON string of a non-object is refused: it used to read silently as ``{}``.
- A tool message answers an earlier call: its ``tool_call_id`` is the ``id`` of a call made before it.
- Strings are valid Unicode: a lone surrogate (which cannot be encoded as UTF-8) is refused with
  its position.

A broken rule raises :class:`InvalidField` (a ``ValueError``) naming the field; the dataset reader
turns it into a :class:`~tracer.core.errors.DataError` with file, line and record.

The message rules are for records that become training data. A live conversation (the Retriever, the
gateway, the MCP server) is read leniently by :mod:`tracer.core.live`, which refuses only what it cannot read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class InvalidField(ValueError):
    """An input that breaks a rule; ``field`` is its location (``messages[2].content``)."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


def check_int(value: Any, name: str, minimum: int) -> int:
    """An int >= ``minimum``, else an error naming it: TypeError for another type (bool, float, str),
    ValueError for a smaller int."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def check_k(k: Any, name: str = "k") -> int:
    """``k`` as an int >= 1 (see :func:`check_int`)."""
    return check_int(k, name, 1)


# config keys of evaluate.py / train.py checked before any work: key -> smallest value. train.py's config is
# evaluate.py's (its held-out run) plus the index's own keys, so it is checked by the same rules, save folds
# (0: no held-out run)
EVAL_INTS = {"k": 1, "folds": 2, "seed": 0, "latency_sample": 0}
TRAIN_INTS = {**EVAL_INTS, "folds": 0}
# set in the config or null (their default): key (dotted for a nested one) -> smallest value
OPTIONAL_INTS = {"train_trajectories": 0, "regime.max_steps_per_turn": 1}
BOOLS = ("test_successful_only", "holdout_tools", "insight", "progress", "save_index")
RATES = ("max_executor_error_rate",)  # a number in [0, 1]


def check_config(cfg: Mapping[str, Any], ints: Mapping[str, int]) -> None:
    """The plain settings of a run config (ints, optional ints, true/false, rates), each named as the
    command-line override that sets it (``k (override k=...) must be an int >= 1, got 0``): what
    ``evaluate.py`` and ``train.py`` check before any work, so that a bad override costs no loading and
    leaves no outputs."""
    for key, minimum in ints.items():
        if key in cfg:
            check_int(cfg[key], f"{key} (override {key}=...)", minimum)
    if ints is TRAIN_INTS and cfg.get("folds") == 1:
        raise ValueError("folds (override folds=...) must be 0 (no held-out ablation) or >= 2, got 1")
    for key, minimum in OPTIONAL_INTS.items():
        value = _dotted(cfg, key)
        if value is not None:
            check_int(value, f"{key} (override {key}=...)", minimum)
    for key in BOOLS:
        if key in cfg and not isinstance(cfg[key], bool):
            raise TypeError(f"{key} (override {key}=...) must be true or false, got {cfg[key]!r}")
    for key in RATES:
        value = cfg.get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key in cfg and not (number and 0 <= value <= 1):
            raise ValueError(f"{key} (override {key}=...) must be a number in [0, 1], got {value!r}")


def _dotted(cfg: Mapping[str, Any], key: str) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"``; None where a level is missing or null."""
    for part in key.split("."):
        if not isinstance(cfg, Mapping):
            return None
        cfg = cfg.get(part)
    return cfg


def check_text(value: Any, field: str) -> None:
    """A string that encodes as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str):
        raise InvalidField(field, f"must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidField(
            field, f"lone surrogate {value[e.start]!r} at character {e.start}: not valid Unicode"
        ) from None


def check_content(content: Any, field: str) -> None:
    if content is None:
        return
    if isinstance(content, str):
        check_text(content, field)
        return
    if not isinstance(content, list):
        raise InvalidField(
            field, f"must be a string, null or a list of content parts, got {type(content).__name__}"
        )
    for i, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise InvalidField(f"{field}[{i}]", "a content part must be an object with a 'type'")
        if part["type"] == "text":
            check_text(part.get("text"), f"{field}[{i}].text")


def check_arguments(args: Any, field: str) -> None:
    if args is None or args == "":
        return
    if not isinstance(args, str):
        raise InvalidField(field, f"must be a JSON string encoding an object (as OpenAI sends it), got a "
                                  f"{type(args).__name__}; json.dumps it")
    check_text(args, field)
    try:
        obj = json.loads(args)
    except json.JSONDecodeError as e:
        raise InvalidField(field, f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise InvalidField(field, f"must encode a JSON object, got a {type(obj).__name__}")


def check_messages(messages: Any, tool_names: Any = None) -> None:
    """Apply the message rules; ``tool_names`` (a container), when given, must hold every called name."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidField("messages", f"must be a list of message dicts, got {type(messages).__name__}")
    call_ids: set[str] = set()
    for j, m in enumerate(messages):
        at = f"messages[{j}]"
        if not isinstance(m, Mapping):
            raise InvalidField(at, f"must be a dict, got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise InvalidField(f"{at}.role", f"must be one of {list(ROLES)}, got {m.get('role')!r}")
        check_content(m.get("content"), f"{at}.content")
        calls = m.get("tool_calls") or ()
        if calls and m["role"] != "assistant":
            raise InvalidField(f"{at}.tool_calls", "only assistant messages make tool calls")
        if not isinstance(calls, (list, tuple)):
            raise InvalidField(f"{at}.tool_calls", "must be a list")
        for c, call in enumerate(calls):
            fld = f"{at}.tool_calls[{c}].function"
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise InvalidField(f"{fld}.name", "tool call without a function name")
            check_text(fn["name"], f"{fld}.name")
            if tool_names is not None and fn["name"] not in tool_names:
                raise InvalidField(f"{fld}.name", f"names {fn['name']!r}, which is not in the registry")
            check_arguments(fn.get("arguments"), f"{fld}.arguments")
            if isinstance(call.get("id"), str) and call["id"]:
                call_ids.add(call["id"])
        if m["role"] == "tool":
            tcid = m.get("tool_call_id")
            if not isinstance(tcid, str) or tcid not in call_ids:
                raise InvalidField(f"{at}.tool_call_id", f"{tcid!r} answers no earlier tool call "
                                                         f"(known ids: {sorted(call_ids)[:5]})")
