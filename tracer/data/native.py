"""The native dataset format: ``tools.json`` plus ``trajectories.jsonl`` (see README).

Reading validates at the edge: a malformed line, a missing field, a call naming an unknown tool,
duplicate names or an empty dataset each raise :class:`DataError` naming file, line and field.
Writing is atomic: both files go to a temporary directory that is renamed into place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..io import atomic_dir
from ..types import Registry, Tool, Trajectory
from .base import Dataset, register_loader

_ROLES = {"system", "user", "assistant", "tool"}


def read_json(path: str | Path) -> Any:
    """A JSON file's content; a missing file or bad JSON (with its line) is a DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "file not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(path, f"not valid JSON: {e.msg}", line=e.lineno) from None


def read_json_array(path: str | Path, what: str) -> list:
    """A JSON file holding an array; a missing file, bad JSON (with its line) or another shape is a DataError."""
    arr = read_json(path)
    if not isinstance(arr, list):
        raise DataError(path, f"expected a JSON array of {what}")
    return arr


def read_tools(path: str | Path, source: str = "") -> Registry:
    path = Path(path)
    arr = read_json_array(path, "OpenAI tool objects")
    tools, seen = [], {}
    for i, obj in enumerate(arr):
        fn = obj.get("function") if isinstance(obj, dict) else None
        if not isinstance(fn, dict):
            raise DataError(path, "expected {'type': 'function', 'function': {...}}", record=f"#{i}", field="function")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise DataError(path, "missing or empty tool name", record=f"#{i}", field="function.name")
        if name in seen:
            raise DataError(path, f"duplicate tool name {name!r} (first at #{seen[name]})", record=f"#{i}",
                            field="function.name")
        seen[name] = i
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise DataError(path, "parameters must be a JSON schema object", record=name, field="function.parameters")
        tools.append(Tool(name=name, description=fn.get("description", "") or "", parameters=params, source=source))
    return Registry(tools)


def _check_messages(path: Path, lineno: int, tid: str, messages, registry: Registry) -> None:
    if not isinstance(messages, list):
        raise DataError(path, "messages must be a list", line=lineno, record=tid, field="messages")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise DataError(path, f"message {j} needs a role in {sorted(_ROLES)}", line=lineno, record=tid,
                            field=f"messages[{j}].role")
        for c, call in enumerate(m.get("tool_calls") or ()):
            fld = f"messages[{j}].tool_calls[{c}].function"
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise DataError(path, "tool call without function.name", line=lineno, record=tid, field=fld)
            if fn["name"] not in registry:
                raise DataError(path, f"tool call names {fn['name']!r}, which is not in tools.json", line=lineno,
                                record=tid, field=fld + ".name")
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    json.loads(args or "{}")
                except json.JSONDecodeError:
                    raise DataError(path, "arguments are not a JSON string", line=lineno, record=tid,
                                    field=fld + ".arguments") from None


def iter_jsonl(path: str | Path, missing: str = "file not found") -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSONL file; bad lines are a DataError naming the line."""
    path = Path(path)
    if not path.exists():
        raise DataError(path, missing)
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(path, f"not valid JSON: {e.msg}", line=lineno) from None
            if not isinstance(obj, dict):
                raise DataError(path, "expected a JSON object", line=lineno)
            yield lineno, obj


def read_trajectories(path: str | Path, registry: Registry) -> list[Trajectory]:
    path = Path(path)
    out, ids = [], {}
    for lineno, obj in iter_jsonl(path):
        for fld, typ in (("id", str), ("group", str), ("domain", str), ("messages", list)):
            if not isinstance(obj.get(fld), typ):
                raise DataError(path, f"missing or not a {typ.__name__}", line=lineno, record=obj.get("id"),
                                field=fld)
        tid = obj["id"]
        if tid in ids:
            raise DataError(path, f"duplicate id (first on line {ids[tid]})", line=lineno, record=tid, field="id")
        ids[tid] = lineno
        _check_messages(path, lineno, tid, obj["messages"], registry)
        reward = obj.get("reward", 1.0)
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            raise DataError(path, "reward must be a number", line=lineno, record=tid, field="reward")
        success = obj.get("success", True)
        if not isinstance(success, bool):
            raise DataError(path, "success must be true or false", line=lineno, record=tid, field="success")
        meta = obj.get("metadata") or {}
        if not isinstance(meta, dict):
            raise DataError(path, "metadata must be an object", line=lineno, record=tid, field="metadata")
        out.append(Trajectory(id=tid, group=obj["group"], domain=obj["domain"], messages=tuple(obj["messages"]),
                              reward=float(reward), success=success, metadata=meta))
    if not out:
        raise DataError(path, "empty dataset: no trajectories")
    return out


@register_loader("jsonl")
def load_native(path: str | Path, name: str | None = None, **_) -> Dataset:
    """Read a dataset directory in the native format."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(root, "dataset directory not found")
    registry = read_tools(root / "tools.json")
    if len(registry) == 0:
        raise DataError(root / "tools.json", "empty registry: no tools")
    trajs = read_trajectories(root / "trajectories.jsonl", registry)
    return Dataset(name=name or root.name, registry=registry, trajectories=tuple(trajs))


def write_native(path: str | Path, registry: Registry, trajectories: Iterable[Trajectory]) -> Path:
    """Write a dataset directory atomically (temporary directory, then swapped into place)."""
    with atomic_dir(path) as tmp:
        (tmp / "tools.json").write_text(json.dumps(registry.to_openai(), indent=1))
        with open(tmp / "trajectories.jsonl", "w") as f:
            f.writelines(json.dumps(t.to_json()) + "\n" for t in trajectories)
    return Path(path)
