"""Where a scorer loses BFCL's miss_func tasks: the turn that follows the withheld-function turn.

    python -m experiments.studies.bfcl_miss_func.bfcl_miss_func FREE_RUNNING_RUN [TEACHER_FORCING_RUN]

In ``miss_func`` BFCL withholds a function in the turn that needs it (that turn's ground truth is
empty) and the calls come one turn later, whose user message is only a placeholder. For each failed
``miss_func`` task of a free-running run, this finds the first step whose gold tool was not in the
top k, and counts how many fall in that later turn (``metadata["missed_function"]`` names it) and
how many of those miss the withheld function itself. Given a teacher-forcing run too, it prints
recall at k per BFCL category. Reads the runs' ``steps.jsonl`` and ``tasks.jsonl``.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from tracer.data import load_dataset
from tracer.data.native import iter_jsonl
from tracer.eval.outputs import read_steps


def category(trajectory_id: str) -> str:
    return trajectory_id.rsplit("_", 1)[0].removeprefix("multi_turn_")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("free_running_run", type=Path)
    ap.add_argument("teacher_forcing_run", type=Path, nargs="?")
    a = ap.parse_args()

    tasks = [t for _, t in iter_jsonl(a.free_running_run / "tasks.jsonl")]
    failed = {t["trajectory_id"] for t in tasks if not t["success"] and t["category"] == "miss_func"}
    first_miss = {}
    for r in read_steps(a.free_running_run / "steps.jsonl"):
        if r.trajectory_id in failed and not r.hit_at_k and r.trajectory_id not in first_miss:
            first_miss[r.trajectory_id] = r
    meta = {t.id: t.metadata for t in load_dataset("bfcl", categories=["miss_func"]).trajectories}
    at_turn = withheld = 0
    for tid, r in first_miss.items():
        missed = meta[tid]["missed_function"]  # {turn: [names]}: the turn where the function comes back
        turns = {int(t) for t in missed}
        if r.turn in turns:
            at_turn += 1
            withheld += r.gold in {n for names in missed.values() for n in names}
    print(f"{a.free_running_run.name}: {len(failed)} failed miss_func tasks; first missed gold tool in the "
          f"returning turn for {at_turn}, of which {withheld} are the withheld function itself")

    if a.teacher_forcing_run:
        hits = defaultdict(list)
        for r in read_steps(a.teacher_forcing_run / "steps.jsonl"):
            hits[category(r.trajectory_id)].append(r.hit_at_k)
        print(f"{a.teacher_forcing_run.name}: recall at k by category: "
              + ", ".join(f"{c} {sum(v) / len(v):.3f} ({len(v)} steps)" for c, v in sorted(hits.items())))


if __name__ == "__main__":
    main()
