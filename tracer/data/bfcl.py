"""BFCL v3 multi-turn (base, miss_func, miss_param, long_context) from the installed ``bfcl_eval`` package.

The data is read from ``bfcl_eval/data`` (found through ``importlib.resources``): the task files
``BFCL_v4_multi_turn_<category>.json`` and their ground truth in ``possible_answer/``. Each
category holds 200 tasks; task ``n`` of every category is a variant of the same underlying task,
so all four share the group ``bfcl-<n>`` and folds keep them together.

Registry: the 128 tools of the eight classic API families (``multi_turn_func_doc/<family>.json``,
memory and web-search left out), ``Tool.source`` = family. BFCL's types become JSON-schema types
(``dict`` -> ``object``, ``float`` -> ``number``, ...; ``any`` drops the type); the ``response``
schema is left out.

Conversations are what BFCL sends a function-calling model, with the ground truth as the answers:

- no system message (BFCL's FC mode has none);
- per turn, the user message, then each gold call as its own assistant message (one tool call,
  id ``<task id>-t<turn>-c<i>``, arguments as JSON) followed by a tool message with its result.
  Gold calls are parsed with :mod:`ast`; positional arguments are named from the backend method's
  signature;
- a turn always has exactly one user message, so step turn numbers are BFCL turn numbers. The
  miss_func turn where the held-out function comes back has no user message in BFCL; it gets
  BFCL's own prompt for that moment, ``"I have updated some more functions you can choose from.
  What about now?"`` (several user messages in one turn would be joined by a blank line);
- a turn whose ground truth is empty (miss_param's clarification turn, miss_func's turn asking
  for the missing function, three base turns) keeps its user message and has no calls.

With ``execute=True`` the gold calls run on BFCL's real backends (:class:`~.bfcl_backends.BFCLBackends`,
fresh per task, from ``initial_config``) and each tool message holds the call's result;
``metadata["execution_errors"]`` counts calls that raised. With ``execute=False`` tool messages
are empty strings and nothing is executed.

Domain is the task's API classes, sorted and joined by ``+`` (e.g. ``GorillaFileSystem+TwitterAPI``).
"""

from __future__ import annotations

import ast
import importlib.resources
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracer.core.errors import DataError
from tracer.core.types import Registry, Tool, ToolCall, Trajectory
from tracer.data.base import Dataset, register_loader
from tracer.data.bfcl_backends import CLASSIC_CLASSES, FAMILY_OF, BFCLBackends, backend_config, public_methods
from tracer.data.native import iter_jsonl

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
# free-running runs BFCL tasks on its backends with its turn rules and checker (tracer.envs.bfcl)
ENVIRONMENT = "tracer.envs.bfcl.BFCLEnvironment"
# BFCL's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC (checked in the tests)
MISSING_FUNCTION_PROMPT = "I have updated some more functions you can choose from. What about now?"

# BFCL type names -> JSON-schema types; None drops the type (any value).
_TYPES: dict[str, str | None] = {
    "dict": "object", "object": "object", "float": "number", "number": "number", "double": "number",
    "integer": "integer", "int": "integer", "long": "integer", "string": "string", "str": "string",
    "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "tuple": "array",
    "null": "null", "any": None,
}


def data_dir() -> Path:
    """The installed ``bfcl_eval/data`` directory."""
    backend_config()  # a clear error when bfcl_eval is missing
    return Path(str(importlib.resources.files("bfcl_eval") / "data"))


def _read_jsonl(path: Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path, "file not found (is bfcl_eval installed with its data?)")]


# --- registry --------------------------------------------------------------------------------

def convert_schema(schema: Any, path: Path | str = "", where: str = "parameters") -> Any:
    """A BFCL parameter schema as JSON schema, recursively (types mapped, everything else kept)."""
    if isinstance(schema, list):
        return [convert_schema(s, path, f"{where}[{i}]") for i, s in enumerate(schema)]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            if value not in _TYPES:
                raise DataError(path, f"unknown BFCL type {value!r}; known: {', '.join(sorted(_TYPES))}",
                                field=f"{where}.type")
            if _TYPES[value] is not None:
                out["type"] = _TYPES[value]
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: convert_schema(v, path, f"{where}.properties.{k}") for k, v in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
            out[key] = convert_schema(value, path, f"{where}.{key}")
        else:
            out[key] = value
    return out


def load_registry(root: Path | None = None) -> Registry:
    """The 128 tools of the eight classic BFCL multi-turn families, ``source`` = family."""
    root = root or data_dir()
    tools: list[Tool] = []
    first: dict[str, str] = {}
    for class_name in CLASSIC_CLASSES:
        family = FAMILY_OF[class_name]
        path = root / "multi_turn_func_doc" / f"{family}.json"
        for i, doc in enumerate(_read_jsonl(path)):
            name = doc.get("name")
            if not isinstance(name, str) or not name:
                raise DataError(path, "missing tool name", record=f"#{i}", field="name")
            if name in first:
                raise DataError(path, f"tool {name!r} is also defined by family {first[name]!r}; "
                                "BFCL tool names must be unique across families", record=name, field="name")
            first[name] = family
            params = convert_schema(doc.get("parameters") or {"type": "dict", "properties": {}}, path,
                                    f"{name}.parameters")
            params["type"] = "object"
            params.setdefault("properties", {})
            tools.append(Tool(name=name, description=doc.get("description", "") or "", parameters=params,
                              source=family))
    return Registry(tools)


# --- gold calls --------------------------------------------------------------------------------

def parse_call(text: str) -> tuple[str, tuple, dict[str, Any]]:
    """``"f(1, x=[2, {'a': -3}])"`` -> ``("f", (1,), {"x": [2, {"a": -3}]})``; literals only.

    Raises:
        ValueError: not a single call of a plain name with literal arguments.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a Python call: {text!r} ({e.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        # a bad text, not a bad type: TRY004 does not apply
        raise ValueError(f"not a call of a plain function name: {text!r}")  # noqa: TRY004
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError(f"**kwargs are not supported: {text!r}")
            kwargs[kw.arg] = ast.literal_eval(kw.value)
    except (ValueError, SyntaxError, TypeError) as e:
        raise ValueError(f"arguments are not literals in {text!r}: {e}") from None
    return node.func.id, args, kwargs


class CallBinder:
    """Names positional arguments from the backend method signatures."""

    def __init__(self):
        self._sigs = {n: s for c in CLASSIC_CLASSES for n, s in public_methods(c).items()}

    def __call__(self, name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
        if not args:
            return kwargs
        if name not in self._sigs:
            raise ValueError(f"{name!r} is not a BFCL tool")
        try:
            return dict(self._sigs[name].bind_partial(*args, **kwargs).arguments)
        except TypeError as e:
            raise ValueError(f"arguments do not fit {name}{self._sigs[name]}: {e}") from None


# --- conversations -----------------------------------------------------------------------------

def build_messages(task_id: str, turns: Sequence[Sequence[Mapping[str, Any]]],
                   gold: Sequence[Sequence[tuple[str, dict]]], results: Sequence[Sequence[str]] | None = None,
                   ) -> list[dict[str, Any]]:
    """OpenAI messages for one task: per turn one user message, then each call and its result.

    Args:
        turns: BFCL ``question``: per turn, the user messages (an empty turn gets the missing-function
        prompt). gold: per turn, the (name, arguments) of each gold call.
        results: per turn, each call's result string; None leaves tool messages empty.
    """
    messages: list[dict[str, Any]] = []
    for t, (users, calls) in enumerate(zip(turns, gold, strict=True)):
        text = "\n\n".join(str(u.get("content") or "") for u in users) if users else MISSING_FUNCTION_PROMPT
        messages.append({"role": "user", "content": text})
        for i, (name, arguments) in enumerate(calls):
            call = ToolCall(name=name, arguments=arguments, id=f"{task_id}-t{t}-c{i}")
            messages.append({"role": "assistant", "content": None, "tool_calls": [call.to_openai()]})
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": results[t][i] if results is not None else ""})
    return messages


def _task_number(task_id: str) -> str:
    return task_id.rsplit("_", 1)[-1]


@register_loader("bfcl")
def load_bfcl(categories: Iterable[str] = CATEGORIES, execute: bool = True, name: str = "bfcl",
              **_) -> Dataset:
    """Load BFCL v3 multi-turn: 200 tasks per category, each run on the real backends when ``execute``."""
    categories = (categories,) if isinstance(categories, str) else tuple(categories)
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown or not categories:
        raise ValueError(f"unknown BFCL categories {unknown}; valid: {', '.join(CATEGORIES)}")
    root = data_dir()
    registry = load_registry(root)
    bind = CallBinder()
    trajectories: list[Trajectory] = []
    for category in categories:
        task_path = root / f"BFCL_v4_multi_turn_{category}.json"
        answer_path = root / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json"
        answers = {a.get("id"): a for a in _read_jsonl(answer_path)}
        for task in _read_jsonl(task_path):
            tid = task.get("id")
            if not isinstance(tid, str):
                raise DataError(task_path, "missing task id", field="id")
            if tid not in answers:
                raise DataError(answer_path, "no ground truth for this task", record=tid)
            trajectories.append(task_to_trajectory(task, answers[tid].get("ground_truth"), category, registry,
                                                   execute=execute, binder=bind, task_path=task_path,
                                                   answer_path=answer_path))
    return Dataset(name=name, registry=registry, trajectories=tuple(trajectories),
                   environment=ENVIRONMENT)


def task_to_trajectory(task: Mapping[str, Any], truth: Any, category: str, registry: Registry, *,
                       execute: bool = True, binder: CallBinder | None = None,
                       task_path: Path | str = "<bfcl task>",
                       answer_path: Path | str = "<bfcl answer>") -> Trajectory:
    """One BFCL entry and its ground truth (a list of call strings per turn) as a trajectory."""
    bind = binder or CallBinder()
    tid = task.get("id")
    if not isinstance(tid, str) or "_" not in tid:
        raise DataError(task_path, "missing task id (like 'multi_turn_base_7')", record=tid, field="id")
    for key in ("question", "initial_config", "involved_classes"):
        if key not in task:
            raise DataError(task_path, "missing field", record=tid, field=key)
    question = task["question"]
    if not isinstance(truth, list) or len(truth) != len(question):
        raise DataError(answer_path, f"ground truth needs one list per turn ({len(question)} turns)",
                        record=tid, field="ground_truth")
    gold: list[list[tuple[str, dict]]] = []
    for t, (users, turn) in enumerate(zip(question, truth)):
        if not isinstance(users, list) or not isinstance(turn, list):
            raise DataError(answer_path if not isinstance(turn, list) else task_path, "a turn must be a list",
                            record=tid,
                            field=f"{'ground_truth' if not isinstance(turn, list) else 'question'}[{t}]")
        calls = []
        for i, text in enumerate(turn):
            fld = f"ground_truth[{t}][{i}]"
            try:
                fname, args, kwargs = parse_call(text)
                # exactly what the message holds
                arguments = json.loads(json.dumps(bind(fname, args, kwargs)))
            except (ValueError, TypeError) as e:
                raise DataError(answer_path, str(e), record=tid, field=fld) from None
            if fname not in registry:
                raise DataError(answer_path, f"call names {fname!r}, which is not a BFCL tool", record=tid,
                                field=fld)
            extra = set(arguments) - set(registry.get(fname).parameters.get("properties", {}))
            if extra:
                raise DataError(answer_path, f"{fname} has no parameters {sorted(extra)}", record=tid,
                                field=fld)
            calls.append((fname, arguments))
        gold.append(calls)

    long_context = "long_context" in category
    metadata: dict[str, Any] = {
        "category": category, "bfcl_id": tid, "involved_classes": list(task["involved_classes"]),
        "initial_config": task["initial_config"], "long_context": long_context, "path": task.get("path", []),
        "excluded_function": task.get("excluded_function", []),
        "missed_function": task.get("missed_function", {}), "ground_truth": truth,
    }
    results = None
    if execute:
        env = BFCLBackends(task["involved_classes"], task["initial_config"], long_context=long_context)
        results = [[env.execute(n, a) for n, a in calls] for calls in gold]
        metadata["execution_errors"] = env.errors
    messages = build_messages(tid, question, gold, results)
    return Trajectory(id=tid, group=f"bfcl-{_task_number(tid)}",
                      domain="+".join(sorted(task["involved_classes"])),
                      messages=tuple(messages), reward=1.0, success=True, metadata=metadata)
