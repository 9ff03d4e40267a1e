"""``tracer update``: add logged trajectories to a saved index and save it in place (atomically).

``--log`` is a ``trajectories.jsonl`` file (every call must name a tool of the index) or a native dataset
directory (``tools.json`` + ``trajectories.jsonl``), whose tools not yet in the index are registered
with their fallback vectors. ``--refit`` also refits the learned weights (blend head, candidate model)
on ``--history`` (the dataset the index was built from: a native dataset directory or a loader name;
the index does not keep its trajectories) plus the log, before saving.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracer.core.errors import DataError
from tracer.data import load_dataset, load_native
from tracer.data.native import read_tools, read_trajectories
from tracer.retriever import Retriever


def read_log(path: Path, registry) -> tuple[list, list]:
    """(trajectories, tools) of a log file or dataset directory, validated against the index's registry
    extended by the directory's tools."""
    if path.is_dir():
        tools = list(read_tools(path / "tools.json"))
        known = registry.extend(t for t in tools if t.name not in registry)
        return read_trajectories(path / "trajectories.jsonl", known), tools
    if not path.exists():
        raise DataError(path, "no such log file or dataset directory")
    return read_trajectories(path, registry), []


def update(args: argparse.Namespace) -> int:
    retriever = Retriever.load(args.index, cache_dir=args.cache_dir)
    trajectories, tools = read_log(Path(args.log), retriever.registry)
    up = retriever.updater
    up.background = False
    if args.refit:
        if args.history is None:
            raise ValueError("--refit needs --history: the trajectories the index was built from")
        history = Path(args.history)
        up.trajectories = list((load_native(history) if history.is_dir() else load_dataset(args.history)).trajectories)
    report = up.update(trajectories, tools)
    if args.refit:
        report["refit"] = up.refit(wait=True)
    retriever.save(args.index)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in report.items()}))
    return 0



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", required=True, help="saved index directory (Retriever.save)")
    p.add_argument("--log", required=True, help="trajectories.jsonl, or a dataset directory with tools.json")
    p.add_argument("--refit", action="store_true", help="refit the learned weights on --history plus the log")
    p.add_argument("--history", help="dataset the index was built from (directory or loader name), for --refit")
    p.add_argument("--cache-dir", default=".cache/embeddings", help="embedding cache ('' for none)")


def run(args: argparse.Namespace) -> int:
    if args.cache_dir == "":
        args.cache_dir = None
    try:
        return update(args)
    except (DataError, FileNotFoundError, KeyError, ValueError) as e:
        print(f"tracer update: {e}", file=sys.stderr)
        return 2
