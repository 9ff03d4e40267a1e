"""``tracer update``: add logged trajectories to a saved index and save it in place (atomically).

``--log`` is a ``trajectories.jsonl`` file (every call must name a tool of the index) or a native dataset
directory (``tools.json`` + ``trajectories.jsonl``, and the segments of a rotated gateway log), whose tools
that the log's trajectories call and the index lacks are registered with their fallback vectors (a tool
only offered to the model is not). ``--refit`` also refits the learned weights (blend head, candidate model)
on ``--history`` (the dataset the index was built from: a native dataset directory or a loader name; the
index does not keep its trajectories) plus the log, before saving.

Each logged trajectory is learned once: the index keeps the ids it applied with a digest of their content
(:mod:`tracer.core.applied`), so a growing log can be applied again and again; an update with nothing new
saves nothing (``"saved": false``). A line whose id the index applied with other content is another
trajectory under a reused id: it is learned, and counted in ``id_reused`` with its ``file:line`` listed in
``id_reused_at``.

One update at a time: the update holds the index's writer lock (:func:`tracer.core.store.writer_lock`) from
loading it to saving it, so a second ``tracer update`` of the same index waits (saying so on stderr) and then
applies its log on top of what the first saved.

The log is read bounded (:mod:`tracer.core.lines`): only regular files (a device such as ``/dev/zero`` or a
FIFO is refused, exit 2), and a line longer than ``--max-line-bytes`` (default 1 MiB, the gateway's
``--log-max-record-bytes``: the longest line it writes) is a bad line, read past without being held.

A bad line (not JSON, a field that breaks the rules of :mod:`tracer.core.messages`, a call to a tool neither
the index nor ``tools.json`` knows, a repeated id) is skipped, and so is a gateway record that calls a tool
the index lacks and no request of any logged conversation offered (``metadata.unoffered``: a name the model
invented; learning it would rank the invention among real tools) and listed in the report as ``file:line:
field: problem``; the rest is applied. Exit status: 0 when the update ran (lines skipped or not), 1 when lines
were skipped and none was valid (nothing learned, nothing saved: a wrong file, most likely), 2 on an error
(no such log, a bad index or ``--history``; with ``--strict``, the first bad line, and nothing is applied).
Every problem is located as ``file:line`` (a ``tools.json`` entry as ``file:#index``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracer.core.errors import DataError
from tracer.core.lines import LOG_LINE_BYTES
from tracer.core.steps import iter_calls
from tracer.core.store import writer_lock
from tracer.core.types import Registry, Tool, Trajectory
from tracer.data import load_dataset, load_native
from tracer.data.native import read_log_trajectories, read_tools, read_trajectories
from tracer.retriever import Retriever

SHOWN_PROBLEMS = 100  # the report lists this many skipped lines (and counts them all)
PROBLEM_CHARS = 300


def read_log(path: Path, registry: Registry, problems: list[DataError] | None,
             max_line_bytes: int = LOG_LINE_BYTES, where: dict[str, tuple[Path, int]] | None = None
             ) -> tuple[list[Trajectory], list[Tool]]:
    """(trajectories, tools to register) of a log file or dataset directory, validated against the index's
    registry extended by the directory's tools; ``problems`` (a list) collects the bad lines, which are
    skipped (None: the first one raises). ``where`` (a dict) is filled with each trajectory's file and
    line."""
    where = {} if where is None else where
    if not path.exists():
        raise DataError(path, "no such log file or dataset directory")
    if not path.is_dir():
        return read_trajectories(path, registry, problems, max_line_bytes=max_line_bytes, where=where), []
    offered = [t for t in read_tools(path / "tools.json", problems=problems) if t.name not in registry]
    trajectories = read_log_trajectories(path, registry.extend(offered), problems,
                                         max_line_bytes=max_line_bytes, where=where)
    # a name some record called with a request offering it is a real tool (registered now), wherever it is
    # called; one that no record's requests offered and the index lacks is an invention
    unoffered = {t.id: set(_names(t.metadata.get("unoffered"))) for t in trajectories}
    real = {n for t in trajectories for _, _, n, _ in iter_calls(t.messages) if n not in unoffered[t.id]}
    invented = {t.id: sorted(n for n in unoffered[t.id] if n not in registry and n not in real)
                for t in trajectories}
    for t in trajectories:
        if invented[t.id]:
            file, line = where[t.id]
            e = DataError(file, f"calls {', '.join(invented[t.id])}, which no request offered "
                                "and the index lacks: not learned", line=line, record=t.id,
                          field="metadata.unoffered")
            if problems is None:
                raise e
            problems.append(e)
    trajectories = [t for t in trajectories if not invented[t.id]]
    called = {name for t in trajectories for _, _, name, _ in iter_calls(t.messages)}
    return trajectories, [t for t in offered if t.name in called]


def _names(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def problem_line(e: DataError) -> str:
    """``file:line: field: problem`` (``-`` for no field; a tools.json entry by its ``#index``)."""
    at = e.line if e.line is not None else (e.record or "-")
    text = f"{e.path}:{at}: {e.field or '-'}: {e.problem}"
    return text if len(text) <= PROBLEM_CHARS else text[:PROBLEM_CHARS] + f"…({len(text)} chars)"


def update(args: argparse.Namespace) -> int:
    """Apply the log under the index's writer lock: load, learn, save with no other update in between."""
    def waiting() -> None:
        print(f"tracer update: {args.index}: another update holds the index's lock; waiting for it",
              file=sys.stderr, flush=True)

    with writer_lock(args.index, on_wait=waiting):
        return _update(args)


def _update(args: argparse.Namespace) -> int:
    retriever = Retriever.load(args.index, cache_dir=args.cache_dir)
    problems: list[DataError] | None = None if args.strict else []
    where: dict[str, tuple[Path, int]] = {}
    trajectories, tools = read_log(Path(args.log), retriever.registry, problems, args.max_line_bytes, where)
    skipped = {"skipped": len(problems or ()),
               "problems": [problem_line(e) for e in (problems or ())[:SHOWN_PROBLEMS]]}
    if problems and not trajectories:
        print(f"tracer update: {args.log}: no valid line, {len(problems)} skipped; nothing applied",
              file=sys.stderr)
        print(json.dumps({"trajectories": 0, "saved": False, **skipped}))
        return 1
    up = retriever.updater
    up.background = False
    if args.refit:
        if args.history is None:
            raise ValueError("--refit needs --history: the trajectories the index was built from")
        history = Path(args.history)
        up.trajectories = list((load_native(history) if history.is_dir()
                                else load_dataset(args.history)).trajectories)
    report = up.update(trajectories, tools)
    reused = report.pop("reused_ids")
    report["id_reused_at"] = [f"{where[i][0]}:{where[i][1]}: id {i!r}" for i in reused[:SHOWN_PROBLEMS]]
    if args.refit:
        report["refit"] = up.refit(wait=True)
    report["saved"] = bool(report["trajectories"] or report["new_tools"] or args.refit)
    if report["saved"]:
        retriever.save(args.index)
    if problems:
        print(f"tracer update: {args.log}: skipped {len(problems)} bad lines (listed in the report)",
              file=sys.stderr)
    if reused:
        print(f"tracer update: {args.log}: {len(reused)} trajectories reuse an id the index applied with "
              "other content; learned as new ones (listed in the report, id_reused_at)", file=sys.stderr)
    print(json.dumps({**{k: round(v, 4) if isinstance(v, float) else v for k, v in report.items()},
                      **skipped}))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", required=True, help="saved index directory (Retriever.save)")
    p.add_argument("--log", required=True, help="trajectories.jsonl, or a dataset directory with tools.json")
    p.add_argument("--refit", action="store_true", help="refit the learned weights on --history plus the log")
    p.add_argument("--history",
                   help="dataset the index was built from (directory or loader name), for --refit")
    p.add_argument("--strict", action="store_true",
                   help="refuse the whole log at its first bad line (exit 2) instead of skipping bad lines")
    p.add_argument("--cache-dir", default=".cache/embeddings", help="embedding cache ('' for none)")
    p.add_argument("--max-line-bytes", type=_positive, default=LOG_LINE_BYTES,
                   help="a longer log line is skipped unread and reported (default: 1 MiB, the gateway's "
                        "--log-max-record-bytes default; raise both together)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer of bytes, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer of bytes, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.cache_dir == "":
        args.cache_dir = None
    try:
        return update(args)
    except (DataError, FileNotFoundError, KeyError, ValueError) as e:
        print(f"tracer update: {e}", file=sys.stderr)
        return 2
