"""The native dataset format: ``tools.json`` plus ``trajectories.jsonl`` (see docs/data.md).

Reading validates at the edge (the message model of :mod:`tracer.core.messages`): a malformed line, a missing
field, a call naming an unknown tool, duplicate names, bytes that are not UTF-8 (with their byte
offset) or an empty dataset each raise :class:`DataError` naming file, line and field.

Reading a log (``problems=[]``, what ``tracer update`` does): the same rules, but a bad line or tool
entry is appended to ``problems`` (the same :class:`DataError`, with its file and line) and skipped, and an
empty registry or dataset is no error. A log the gateway rotated (:mod:`tracer.serve.log.files`) holds
``trajectories-000001.jsonl``, ``trajectories-000002.jsonl``, ... before ``trajectories.jsonl``; they are read
in that order (:func:`trajectory_files`).

Reading is bounded (:mod:`tracer.core.lines`): only regular files (a device or a FIFO is a DataError naming
it), and a line longer than ``max_line_bytes`` is a bad line, read past without being held
(:data:`~tracer.core.lines.DATASET_LINE_BYTES` for datasets; ``tracer update`` passes the gateway's record
cap).

Writing (:func:`write_native`) replaces each file atomically and refuses a directory holding anything
else (see docs/storage.md).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tracer.core.errors import DataError
from tracer.core.io import atomic_write
from tracer.core.lines import DATASET_LINE_BYTES, bounded_lines, open_regular
from tracer.core.messages import check_messages, check_text
from tracer.core.store import clean_stale
from tracer.core.types import Registry, Tool, Trajectory
from tracer.core.validate import InvalidField
from tracer.data.base import Dataset, register_loader

DATASET_FILES = ("tools.json", "trajectories.jsonl")
SEGMENT = re.compile(r"trajectories-(\d+)\.jsonl")  # a rotated part of a log, numbered in write order
Problems = list  # of DataError: where a lenient read puts what it skipped
Where = dict  # trajectory id -> (file, line): where each trajectory of a read was found


def trajectory_files(root: Path) -> list[Path]:
    """The trajectory files of a dataset directory in write order: rotated segments by number, then
    ``trajectories.jsonl`` (listed even when absent: reading a dataset without it names the missing file)."""
    segments = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := SEGMENT.fullmatch(p.name)))
    return [p for _, p in segments] + [root / "trajectories.jsonl"]


def decode_utf8(path: Path, data: bytes, start: int = 0) -> str:
    """``data`` (found at byte ``start`` of ``path``) as text; bytes that are not UTF-8 are a DataError
    naming the byte offset and line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(path, f"not UTF-8: byte 0x{data[e.start]:02x} at byte offset {start + e.start}",
                        line=None if start else data.count(b"\n", 0, e.start) + 1) from None


def read_json(path: str | Path) -> Any:
    """A JSON file's content; a missing file or bad JSON (with its line) is a DataError."""
    path = Path(path)
    if not path.exists():
        raise DataError(path, "file not found")
    with open_regular(path) as f:  # a device or a FIFO is refused by name: it may never end
        data = f.read()
    try:
        return json.loads(decode_utf8(path, data))
    except json.JSONDecodeError as e:
        raise DataError(path, f"not valid JSON: {e.msg}", line=e.lineno) from None


def read_json_array(path: str | Path, what: str) -> list:
    """A JSON file holding an array; a missing file, bad JSON (with its line) or another shape is a
    DataError."""
    arr = read_json(path)
    if not isinstance(arr, list):
        raise DataError(path, f"expected a JSON array of {what}")
    return arr


def read_tools(path: str | Path, source: str = "", problems: Problems | None = None) -> Registry:
    """The registry of a ``tools.json``; with ``problems`` (a list), a bad entry (or a bad file) is put there
    and skipped. A tool's ``source`` (its toolkit) is its object's ``"source"``, else ``source``."""
    path = Path(path)
    try:
        arr = read_json_array(path, "OpenAI tool objects")
    except DataError as e:
        _note(problems, e)
        return Registry([])
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    for i, obj in enumerate(arr):
        try:
            tools.append(_tool(path, i, obj, seen, source))
        except DataError as e:
            _note(problems, e)
    return Registry(tools)


def _note(problems: Problems | None, e: DataError) -> None:
    """Raise ``e`` when loading, or add it to ``problems`` when validating (every problem of a dataset is
    reported at once)."""
    if problems is None:
        raise e
    problems.append(e)


def _tool(path: Path, i: int, obj: Any, seen: dict[str, int], source: str) -> Tool:
    fn = obj.get("function") if isinstance(obj, dict) else None
    if not isinstance(fn, dict):
        raise DataError(path, "expected {'type': 'function', 'function': {...}}", record=f"#{i}",
                        field="function")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise DataError(path, "missing or empty tool name", record=f"#{i}", field="function.name")
    try:
        check_text(name, "function.name")
        check_text(fn.get("description", "") or "", "function.description")
    except InvalidField as e:
        raise DataError(path, e.problem, record=f"#{i}", field=e.field) from None
    if name in seen:
        raise DataError(path, f"duplicate tool name {name!r} (first at #{seen[name]})", record=f"#{i}",
                        field="function.name")
    seen[name] = i
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise DataError(path, "parameters must be a JSON schema object", record=name,
                        field="function.parameters")
    own = obj.get("source", source)  # the tool's toolkit (an API family, an MCP server), else the file's
    try:
        if not isinstance(own, str):
            raise InvalidField("source", f"must be a string (the tool's toolkit), got {own!r}")
        check_text(own, "source")
    except InvalidField as e:
        raise DataError(path, e.problem, record=name, field=e.field) from None
    return Tool(name=name, description=fn.get("description", "") or "", parameters=params, source=own)


def iter_jsonl(path: str | Path, missing: str = "file not found", problems: Problems | None = None,
               max_line_bytes: int = DATASET_LINE_BYTES) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSONL file; a bad line is a DataError naming the
    line (with ``problems``, a list: put there, and the line skipped). Bounded (:mod:`tracer.core.lines`):
    only a regular file is read, and a line over ``max_line_bytes`` is a bad line, read past unheld."""
    path = Path(path)
    if not path.exists():
        raise DataError(path, missing)
    with open_regular(path) as f:
        for lineno, start, raw, size in bounded_lines(f, max_line_bytes):
            try:
                if raw is None:
                    raise DataError(path, f"{size} bytes, over the line cap of {max_line_bytes} bytes: "
                                          "not read", line=lineno)
                obj = json_line(path, raw, lineno, start)
            except DataError as e:
                _note(problems, e)
                continue
            if obj is not None:
                yield lineno, obj


def json_line(path: str | Path, raw: bytes, lineno: int, start: int = 0) -> dict | None:
    """The object on one line (None for a blank line), else a DataError naming the line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(path, f"not UTF-8: byte 0x{raw[e.start]:02x} at byte offset {start + e.start}",
                        line=lineno) from None
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(path, f"not valid JSON: {e.msg}", line=lineno) from None
    if not isinstance(obj, dict):
        raise DataError(path, "expected a JSON object", line=lineno)
    return obj


def read_trajectories(path: str | Path, registry: Registry, problems: Problems | None = None, *,
                      max_line_bytes: int = DATASET_LINE_BYTES, where: Where | None = None
                      ) -> list[Trajectory]:
    """The trajectories of a JSONL file, every call naming a tool of ``registry``; with ``problems`` (a list),
    a bad line is put there and skipped, and an empty file is no error. A line over ``max_line_bytes`` is a
    bad line; ``where`` (a dict) is filled with each trajectory's file and line, by id."""
    out = _read_file(Path(path), registry, problems, {} if where is None else where, max_line_bytes)
    if not out and problems is None:
        raise DataError(path, "empty dataset: no trajectories")
    return out


def _read_file(path: Path, registry: Registry, problems: Problems | None,
               ids: dict[str, tuple[Path, int]], max_line_bytes: int) -> list[Trajectory]:
    """``ids``: the ids read so far and where, shared by the files of one log (an id repeated across them)."""
    out = []
    for lineno, obj in iter_jsonl(path, problems=problems, max_line_bytes=max_line_bytes):
        try:
            out.append(_trajectory(path, lineno, obj, registry, ids))
        except DataError as e:
            _note(problems, e)
    return out


def _trajectory(path: Path, lineno: int, obj: dict, registry: Registry, ids: dict[str, tuple[Path, int]]
                ) -> Trajectory:
    for fld, typ in (("id", str), ("group", str), ("domain", str), ("messages", list)):
        if not isinstance(obj.get(fld), typ):
            raise DataError(path, f"missing or not a {typ.__name__}", line=lineno, record=obj.get("id"),
                            field=fld)
    for fld in ("id", "group"):
        if not obj[fld].strip():
            raise DataError(path, "must be a non-empty string", line=lineno, record=obj.get("id"), field=fld)
    tid = obj["id"]
    if tid in ids:
        first, at = ids[tid]
        where = f"line {at}" if first == path else f"{first}, line {at}"
        raise DataError(path, f"duplicate id (first on {where})", line=lineno, record=tid, field="id")
    try:
        check_messages(obj["messages"], registry)
    except InvalidField as e:
        raise DataError(path, e.problem, line=lineno, record=tid, field=e.field) from None
    reward = obj.get("reward", 1.0)
    if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not math.isfinite(reward):
        raise DataError(path, f"reward must be a finite number, got {reward!r}", line=lineno, record=tid,
                        field="reward")
    success = obj.get("success", True)
    if not isinstance(success, bool):
        raise DataError(path, "success must be true or false", line=lineno, record=tid, field="success")
    meta = obj.get("metadata") or {}
    if not isinstance(meta, dict):
        raise DataError(path, "metadata must be an object", line=lineno, record=tid, field="metadata")
    ids[tid] = (path, lineno)  # only a valid line claims its id: a bad line's repeat is not a duplicate
    return Trajectory(id=tid, group=obj["group"], domain=obj["domain"], messages=tuple(obj["messages"]),
                      reward=float(reward), success=success, metadata=meta)


def read_log_trajectories(root: Path, registry: Registry, problems: Problems | None = None, *,
                          max_line_bytes: int = DATASET_LINE_BYTES, where: Where | None = None
                          ) -> list[Trajectory]:
    """Every trajectory of a dataset directory's files (:func:`trajectory_files`, in write order), ids unique
    across them; strict (``problems`` None) or lenient, bounded and located as :func:`read_trajectories`."""
    ids: dict[str, tuple[Path, int]] = {} if where is None else where
    files = trajectory_files(root)
    out = []
    for p in files:
        if len(files) > 1 and p.name == "trajectories.jsonl" and not p.exists():
            continue  # rotated away, nothing written since
        out.extend(_read_file(p, registry, problems, ids, max_line_bytes))
    if not out and problems is None:
        raise DataError(root / "trajectories.jsonl", "empty dataset: no trajectories")
    return out


@register_loader("jsonl")
def load_native(path: str | Path, name: str | None = None, problems: Problems | None = None, **_) -> Dataset:
    """Read a dataset directory in the native format (strict). ``problems`` (a list): read it as a log
    instead: bad lines and tool entries are put there and skipped, an empty registry or dataset is allowed."""
    root = Path(path)
    if root.is_file():
        raise DataError(root, "is a file; a native dataset is a directory holding tools.json "
                              "and trajectories.jsonl")
    if not root.is_dir():
        raise DataError(root, "dataset directory not found")
    registry = read_tools(root / "tools.json", problems=problems)
    if len(registry) == 0 and problems is None:
        raise DataError(root / "tools.json", "empty registry: no tools")
    trajs = read_log_trajectories(root, registry, problems)
    return Dataset(name=name or root.name, registry=registry, trajectories=tuple(trajs),
                   skipped={"bad_lines": len(problems)} if problems else {})


def write_native(path: str | Path, registry: Registry, trajectories: Iterable[Trajectory]) -> Path:
    """Write a dataset directory: ``tools.json`` and ``trajectories.jsonl``, each replaced atomically.

    The target must be absent, empty, or hold only those two files (an earlier dataset) and our
    temporaries; anything else is refused and nothing is deleted. Temporaries of a crashed write
    are removed. Trajectories are written first, so a reader racing a rewrite that adds tools
    sees calls it cannot resolve and fails with a located error rather than a silent mixture
    (datasets are written once, then read; see docs/storage.md).
    """
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise FileExistsError(f"{root}: exists and is not a directory; refusing to write a dataset over it")
    if root.is_dir():
        clean_stale(root)
        foreign = sorted(p.name for p in root.iterdir() if p.name not in DATASET_FILES)
        if foreign:
            raise FileExistsError(f"{root}: holds files that are not a tracer dataset "
                                  f"({', '.join(foreign[:5])}); "
                                  "write the dataset to a new or empty directory")
    atomic_write(root / "trajectories.jsonl",
                 lambda f: f.writelines((json.dumps(t.to_json()) + "\n").encode() for t in trajectories),
                 fsync=True)
    tools = [{**t.to_openai(), "source": t.source} if t.source else t.to_openai() for t in registry]
    atomic_write(root / "tools.json", lambda f: f.write(json.dumps(tools, indent=1).encode()),
                 fsync=True)
    return root
