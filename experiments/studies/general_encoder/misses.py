"""Why a run misses: how many of its misses are *prerequisites*, calls the agent makes before the one the
request names.

    python -m experiments.studies.general_encoder.misses RUN [RUN ...] [--top 8]

A step is a miss when its gold tool is not among the presented. It is a *prerequisite miss* when a later call
of the same turn (teacher forcing: the steps after it with the same fold, trajectory and turn) is a tool that
this step presented: the selector offered what the user asked for, and the agent first had to call something
else (``pressBrakePedal`` before ``startEngine``, ``cd`` before a file operation, API-Bank's ``ToolSearcher``
before the tool it finds). Nothing in a tool's schema says that it must come first, so a ranking without logs
cannot know; a few logged trajectories teach it (the trie's edges). Printed per run: the steps, recall@5 of
the presented, the misses, the prerequisite misses (their share of the steps) and their commonest gold tools.

``--predecessors`` estimates a memory keyed by the tool the request names rather than by the state: one more
slot for the tool the run's own training trajectories (its folds, seed and ``train_trajectories``, from
``run_info.json``; not a held-out-tools run) called most often just before the step's first presented tool,
within a turn. Printed: the prerequisite misses whose gold it names, and the hits it would displace (a gold
presented last, in the slot it would take).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from hydra.utils import instantiate

from tracer.core.folds import arrival_order, kfold
from tracer.core.steps import extract_steps
from tracer.eval.outputs import read_steps


def prerequisite_misses(records) -> tuple[list, list]:
    """The misses of ``records`` (a run's step records) and, of them, the prerequisite misses (module
    docstring), each in the records' order."""
    by_key = {(r.fold, r.trajectory_id, r.step): r for r in records}
    misses, prerequisites = [], []
    for r in records:
        if r.gold in r.presented:
            continue
        misses.append(r)
        later, s = [], r.step + 1
        while (nxt := by_key.get((r.fold, r.trajectory_id, s))) is not None and nxt.turn == r.turn:
            later.append(nxt.gold)
            s += 1
        if any(g in r.presented for g in later):
            prerequisites.append(r)
    return misses, prerequisites


def predecessor_slot(records, prerequisites, train: Mapping[int, Sequence]) -> tuple[int, int]:
    """``(prerequisite misses named, hits displaced)`` by the predecessor slot (module docstring), ``train``:
    each fold's training trajectories."""
    before: dict[int, dict[str, Counter]] = {}  # fold -> tool -> the calls just before it within a turn
    for fold, trajectories in train.items():
        table = before.setdefault(fold, {})
        for t in trajectories:
            for s in extract_steps(t):
                if s.prefix:
                    table.setdefault(s.gold, Counter())[s.prefix[-1]] += 1
    ids = {id(r) for r in prerequisites}
    named = displaced = 0
    for r in records:
        counts = before.get(r.fold, {}).get(r.presented[0]) if r.presented else None
        slot = next((t for t, _ in counts.most_common() if t not in r.presented), None) if counts else None
        if slot is None:
            continue
        named += id(r) in ids and r.gold == slot
        displaced += r.gold == r.presented[-1]
    return named, displaced


def training(run: Path) -> dict[int, list]:
    """Each fold's training trajectories of ``run``, as ``evaluate.py`` chose them (``run_info.json``)."""
    cfg = json.loads((run / "run_info.json").read_text())["config"]
    if cfg.get("holdout_tools"):
        raise SystemExit(f"{run}: --predecessors reads no held-out-tools run (holdout_tools=true)")
    ds = instantiate(cfg["dataset"])
    return {split.fold: arrival_order(split.train, cfg["seed"], split.fold)[:cfg["train_trajectories"]]
            for split in kfold(ds.trajectories, cfg["folds"], cfg["seed"])}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (each with steps.jsonl)")
    ap.add_argument("--top", type=int, default=8, help="gold tools of the prerequisite misses to list")
    ap.add_argument("--predecessors", action="store_true", help="estimate the predecessor slot too")
    args = ap.parse_args(argv)
    extra = " predecessor slot: named | displaced |" if args.predecessors else ""
    print(f"| run | steps | recall@5 | misses | prerequisite misses (share of steps) | commonest |{extra}")
    print("|---|---:|---:|---:|---:|---|" + ("---:|---:|" if args.predecessors else ""))
    for run in args.runs:
        records = read_steps(run / "steps.jsonl")
        misses, pre = prerequisite_misses(records)
        n = len(records)
        common = ", ".join(f"{g} {c}" for g, c in Counter(r.gold for r in pre).most_common(args.top))
        row = f"| {run} | {n} | {1 - len(misses) / n:.3f} | {len(misses)} | {len(pre)} ({len(pre) / n:.3f}) "
        if args.predecessors:
            named, displaced = predecessor_slot(records, pre, training(run))
            common += f" | {named} | {displaced}"
        print(f"{row}| {common} |")


if __name__ == "__main__":
    main()
