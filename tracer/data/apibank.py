"""API-Bank test dialogues as gold trajectories (see the datasets README, section 2).

Levels 1 and 2 (``json_test_data/level-{1,2}-api.json``) hold per-call samples of dialogues: each
item's ``input`` is the dialogue up to one call, one line per event (``User: ...``, ``AI: ...``,
``API-Request: [Name(k='v', ...)]->result``) and ends with ``Generate API Request:``; its
``expected_output`` is that call. Every item of a dialogue (``file``) is a prefix of the longest one,
so a dialogue is rebuilt from its longest item plus that item's expected call:

- ``User:`` lines become user messages and ``AI:`` lines assistant text messages;
- each ``API-Request:`` becomes an assistant message with the tool call(s), followed by a tool
  message per call whose content is the text after ``->``;
- the final expected call has no result in the data, so it gets no tool message.

Requests are parsed (:mod:`tracer.data.apibank_request`) with :mod:`ast` as a Python list of calls with
keyword arguments whose values are literals. In the rebuilt dialogues, 40 requests (30 in level 1, 10 in level
2) quote a list or dict literal that itself contains single quotes (``health_data='[{'name': ...}]'``,
``attendees='['John']'``), which is not valid Python. For those, the quotes around ``[...]`` and ``{...}`` are
dropped, the text is parsed again, and the value is kept as the string it was meant to be (its source text).
Such trajectories carry ``metadata["repaired"]`` (the count).

Level 3 (``level-3.json``): one conversation per item: the ``requirement`` as the user message,
each entry of ``apis`` as a tool call with its output (JSON) as the tool result, and the
``response`` as the final assistant message. ``ToolSearcher`` calls are ordinary calls of the
``ToolSearcher`` tool, which ``tools_lv3.json`` defines.

Registry: ``tools.json`` (53 tools, ``source="apibank"``) for levels 1 and 2, ``tools_lv3.json``
(22 tools, ``source="apibank-l3"``) for level 3. When both are loaded, the four level-3 names that
also exist in ``tools.json`` (``AddMeeting``, ``Calculator``, ``QueryMeeting``, ``ToolSearcher``)
become ``lv3__<name>`` and level-3 calls are renamed to match. ``AddMeeting`` and ``QueryMeeting``
differ in signature; ``Calculator`` is identical in both files and ``ToolSearcher`` differs by one
letter of its description, so a pooled registry holds near-copies that differ by the prefix.

Nothing is dropped silently: a dialogue (levels 1–2) or item (level 3) with a request that does not
parse, or that names an API missing from its tool file, is skipped whole and counted in
``Dataset.skipped``; so are level 1–2 items that are not a prefix of their dialogue.

Ids: ``apibank-l{level}-{file without .jsonl}`` and ``apibank-l3-{index}``. Groups: the dialogue file
name (levels 1–2; no file appears in both levels) and ``lv3-{index}``. Domains: ``apibank-l1``,
``apibank-l2``, ``apibank-l3``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tracer.core.errors import DataError
from tracer.core.types import Registry, Tool, Trajectory
from tracer.data.apibank_request import RequestError, parse_request
from tracer.data.base import Dataset, register_loader
from tracer.data.native import read_json_array, read_tools
from tracer.data.paths import resolve_path

LEVELS = (1, 2, 3)
LV3_PREFIX = "lv3__"
_GENERATE = "Generate API Request:"
_REQUEST = "API-Request: "
SKIP_UNPARSABLE = "dialogues with an unparsable API-Request"
SKIP_UNKNOWN_API = "dialogues calling an API missing from tools.json"
SKIP_NOT_PREFIX = "items that are not a prefix of their dialogue"
SKIP_BAD_INPUT = "items whose input does not end with 'Generate API Request:'"
SKIP_LV3_UNKNOWN_API = "level-3 items calling an API missing from tools_lv3.json"
SKIP_LV3_BAD_CALL = "level-3 items with a malformed apis entry"


class _Unusable(Exception):
    """A dialogue or item that is skipped, with the reason it is counted under."""

    def __init__(self, reason: str):
        self.reason = reason


def _call_messages(calls: list[tuple[str, dict]], registry: Registry, rename: dict[str, str], start: int,
                   results: list[str] | None, unknown_reason: str) -> list[dict]:
    """One assistant message holding the calls, then one tool message per call when results are known."""
    tool_calls = []
    for k, (name, args) in enumerate(calls):
        if name not in registry:
            raise _Unusable(unknown_reason)
        name = rename.get(name, name)
        tool_calls.append({"id": f"call_{start + k}", "type": "function",
                           "function": {"name": name, "arguments": json.dumps(args)}})
    out: list[dict] = [{"role": "assistant", "content": None, "tool_calls": tool_calls}]
    for call, result in zip(tool_calls, results or ()):
        out.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                    "content": result})
    return out


def dialogue_messages(text: str, final_request: str, registry: Registry) -> tuple[list[dict], int]:
    """Messages of one level 1–2 dialogue (``input`` without its last line, plus the expected call).

    Returns the messages and how many requests needed the quoting repair. Raises ``_Unusable``.
    """
    messages: list[dict] = []
    repairs = 0
    n_calls = 0

    def add_request(body: str, final: bool) -> None:
        nonlocal repairs, n_calls
        try:
            calls, result, repaired = parse_request(body)
        except RequestError:
            raise _Unusable(SKIP_UNPARSABLE) from None
        repairs += repaired
        results = None if final or result is None else [result] * len(calls)
        messages.extend(_call_messages(calls, registry, {}, n_calls, results, SKIP_UNKNOWN_API))
        n_calls += len(calls)

    for line in text.split("\n"):
        if line.startswith("User: "):
            messages.append({"role": "user", "content": line[len("User: "):]})
        elif line.startswith("AI: "):
            messages.append({"role": "assistant", "content": line[len("AI: "):]})
        elif line.startswith(_REQUEST):
            add_request(line[len(_REQUEST):], final=False)
        elif messages and isinstance(messages[-1].get("content"), str):  # a continuation line
            messages[-1]["content"] += "\n" + line
        elif line.strip():
            raise _Unusable(SKIP_UNPARSABLE)
    if not final_request.startswith(_REQUEST):
        raise _Unusable(SKIP_UNPARSABLE)
    add_request(final_request[len(_REQUEST):], final=True)
    return messages, repairs


def _load_json_list(path: Path) -> list:
    return read_json_array(path, "items")


def _load_dialogues(path: Path, level: int, registry: Registry, skipped: Counter) -> list[Trajectory]:
    by_file: dict[str, list[dict]] = defaultdict(list)
    for i, item in enumerate(_load_json_list(path)):
        for fld in ("file", "input", "expected_output"):
            if not isinstance(item, dict) or not isinstance(item.get(fld), str):
                raise DataError(path, "missing or not a string", record=f"#{i}", field=fld)
        by_file[item["file"]].append(item)

    out = []
    for file, items in by_file.items():
        usable = [it for it in items if it["input"].rstrip().endswith(_GENERATE)]
        skipped[SKIP_BAD_INPUT] += len(items) - len(usable)
        if not usable:
            continue
        longest = max(usable, key=lambda it: len(it["input"]))
        full = longest["input"].rstrip()[: -len(_GENERATE)] + longest["expected_output"]
        consistent = [it for it in usable
                      if full.startswith(it["input"].rstrip()[: -len(_GENERATE)] + it["expected_output"])]
        skipped[SKIP_NOT_PREFIX] += len(usable) - len(consistent)
        try:
            messages, repairs = dialogue_messages(longest["input"].rstrip()[: -len(_GENERATE)].rstrip("\n"),
                                                  longest["expected_output"].strip(), registry)
        except _Unusable as e:
            skipped[e.reason] += 1
            continue
        stem = file.removesuffix(".jsonl")
        meta = {"file": file, "items": len(consistent)}
        if repairs:
            meta["repaired"] = repairs
        out.append(Trajectory(id=f"apibank-l{level}-{stem}", group=file, domain=f"apibank-l{level}",
                              messages=tuple(messages), metadata=meta))
    return out


def _level3_messages(item: Any, registry: Registry, rename: dict[str, str]) -> list[dict]:
    if not isinstance(item, dict) or not isinstance(item.get("requirement"), str) \
            or not isinstance(item.get("apis"), list):
        raise _Unusable(SKIP_LV3_BAD_CALL)
    messages: list[dict] = [{"role": "user", "content": item["requirement"].strip()}]
    for k, api in enumerate(item["apis"]):
        if not isinstance(api, dict) or not isinstance(api.get("api_name"), str) \
                or not isinstance(api.get("input"), dict):
            raise _Unusable(SKIP_LV3_BAD_CALL)
        out = api.get("output")
        if isinstance(out, dict) and out.get("exception"):
            result = f"Exception: {out['exception']}"
        else:
            result = json.dumps(out.get("output") if isinstance(out, dict) else out)
        messages += _call_messages([(api["api_name"], api["input"])], registry, rename, k, [result],
                                   SKIP_LV3_UNKNOWN_API)
    if isinstance(item.get("response"), str) and item["response"].strip():
        messages.append({"role": "assistant", "content": item["response"].strip()})
    return messages


def _parse_levels(levels: int | str | Iterable[int | str]) -> tuple[int, ...]:
    if isinstance(levels, str):
        levels = levels.split(",")
    elif isinstance(levels, int):
        levels = (levels,)
    try:
        chosen = tuple(sorted({int(str(lv).strip()) for lv in levels}))
    except ValueError:
        chosen = ()
    if not chosen or any(lv not in LEVELS for lv in chosen):
        raise ValueError(f"API-Bank levels must be among {LEVELS}, got {levels!r}")
    return chosen


@register_loader("apibank")
def load_apibank(path: str | Path = "../shared/datasets/apibank", levels: int | str | Iterable[int] = LEVELS,
                 name: str = "apibank", **_) -> Dataset:
    """Load API-Bank test dialogues of the chosen levels (see the module docstring).

    Args:
        path: the ``apibank`` data folder; relative paths resolve against the cwd, then the repo root.
        levels: any of 1, 2, 3 (a sequence, one int, or a comma-separated string).
        name: dataset name.
    """
    chosen = _parse_levels(levels)
    root = resolve_path(path)
    tools: list[Tool] = []
    trajectories: list[Trajectory] = []
    skipped: Counter = Counter()
    if 1 in chosen or 2 in chosen:
        reg12 = read_tools(root / "tools.json", source="apibank")
        tools += list(reg12)
        for level in (lv for lv in chosen if lv < 3):
            trajectories += _load_dialogues(root / "json_test_data" / f"level-{level}-api.json", level, reg12,
                                            skipped)
    if 3 in chosen:
        reg3 = read_tools(root / "tools_lv3.json", source="apibank-l3")
        taken = {t.name for t in tools}
        rename = {n: LV3_PREFIX + n for n in reg3.names if n in taken}
        tools += [Tool(name=rename.get(t.name, t.name), description=t.description, parameters=t.parameters,
                       source=t.source) for t in reg3]
        lv3_path = root / "json_test_data" / "level-3.json"
        for i, item in enumerate(_load_json_list(lv3_path)):
            try:
                messages = _level3_messages(item, reg3, rename)
            except _Unusable as e:
                skipped[e.reason] += 1
                continue
            trajectories.append(Trajectory(id=f"apibank-l3-{i}", group=f"lv3-{i}", domain="apibank-l3",
                                           messages=tuple(messages), metadata={"index": i}))
    if not trajectories:
        raise DataError(root, f"no usable dialogue in levels {chosen}")
    return Dataset(name=name, registry=Registry(tools), trajectories=tuple(trajectories),
                   skipped={k: v for k, v in skipped.items() if v})
