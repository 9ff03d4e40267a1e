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
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (each with steps.jsonl)")
    ap.add_argument("--top", type=int, default=8, help="gold tools of the prerequisite misses to list")
    args = ap.parse_args(argv)
    print("| run | steps | recall@5 | misses | prerequisite misses (share of steps) | commonest |")
    print("|---|---:|---:|---:|---:|---|")
    for run in args.runs:
        records = read_steps(run / "steps.jsonl")
        misses, pre = prerequisite_misses(records)
        n = len(records)
        common = ", ".join(f"{g} {c}" for g, c in Counter(r.gold for r in pre).most_common(args.top))
        print(f"| {run} | {n} | {1 - len(misses) / n:.3f} | {len(misses)} | {len(pre)} ({len(pre) / n:.3f}) "
              f"| {common} |")


if __name__ == "__main__":
    main()
