"""python -m experiments.real_model.free_running_table OUT [--oracle ORACLE]: the free-running table.

Reads every run under OUT (``evaluate.py regime=free_running regime.tasks=N``, one directory a configuration:
metrics.json, steps.jsonl, tasks.jsonl), checks that they ran the same tasks, and prints one Markdown row per
run: task success as bfcl_eval's checker decides it, with its Wilson 95% interval, the steps the model took,
its selection accuracy (the gold called, over steps with a gold call), the gold among the presented tools,
the outcome shares, the steps that called the same tool as the task's step before them (a model that does
not take in a tool's result calls it again), the server's prompt tokens and the wall seconds per step. With
``--oracle``, the same configurations' task success under the oracle executor on the same tasks goes beside
(the oracle's runs may hold more: a larger ``regime.tasks`` with the same seed draws the same tasks first).
"""

from __future__ import annotations

import argparse
import statistics
from itertools import pairwise
from pathlib import Path

from experiments.real_model.runs_dir import cell, read_runs
from tracer.eval.pooled import share


def repeats(steps: list[dict]) -> list[bool]:
    """Per step after a task's first: whether it called the same tool as the task's step before it."""
    by_task: dict[str, list[dict]] = {}
    for s in sorted(steps, key=lambda s: (s["trajectory_id"], s["step"])):
        by_task.setdefault(s["trajectory_id"], []).append(s)
    return [b["selected"] is not None and b["selected"] == a["selected"]
            for task in by_task.values() for a, b in pairwise(task)]


def table(out: Path, oracle: Path | None) -> str:
    runs = read_runs(out)
    if not runs:
        raise SystemExit(f"no run under {out}")
    ran = {name: sorted(t["trajectory_id"] for t in run.tasks) for name, run in runs.items()}
    if len({tuple(v) for v in ran.values()}) != 1:
        raise SystemExit(f"the runs under {out} did not run the same tasks: {ran}")
    oracle_success = {}
    if oracle is not None:  # the oracle may have run more tasks: a larger regime.tasks draws these first
        ours = set(next(iter(ran.values())))
        for other in read_runs(oracle).values():
            if not ours <= {t["trajectory_id"] for t in other.tasks}:
                raise SystemExit(f"{other.path} did not run every task of {out}")
            ran_here = [t["success"] for t in other.tasks if t["trajectory_id"] in ours]
            oracle_success[other.label] = cell(share(ran_here))
    header = ("| scorer | k | tasks | task success (bfcl_eval's checker) | oracle's task success | steps | "
              "gold called | gold presented | unpresented call | malformed | no call | same tool as the step "
              "before | prompt tokens (mean) | wall s per step (mean / median) |")
    lines = [header, "|---|---:|---:|---|---|---:|---|---|---|---|---|---|---:|---|"]
    for run in runs.values():
        steps, tasks = run.steps, run.tasks
        gold = [s for s in steps if s.get("gold") is not None]
        seconds = [s["executor_seconds"] for s in steps if s.get("executor_seconds") is not None]
        cells = [cell(share([t["success"] for t in tasks])), oracle_success.get(run.label, "–"),
                 str(len(steps)), cell(share([bool(s["correct"]) for s in gold])),
                 cell(share([bool(s["hit_at_k"]) for s in gold])),
                 *(cell(share([bool(s[f]) for s in steps])) for f in ("unpresented", "malformed", "no_call")),
                 cell(share(repeats(steps))),
                 f"{statistics.mean(s['prompt_tokens'] for s in steps):,.0f}",
                 f"{statistics.mean(seconds):.0f} / {statistics.median(seconds):.0f}" if seconds else "–"]
        lines.append(f"| {' | '.join(run.label)} | {len(tasks)} | {' | '.join(cells)} |")
    tasks = next(iter(ran.values()))
    return "\n".join([*lines, "", f"Tasks: {', '.join(tasks)}"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="a directory of free-running runs, one per configuration")
    parser.add_argument("--oracle", type=Path, default=None, help="the same configurations under the oracle")
    args = parser.parse_args(argv)
    print(table(args.out, args.oracle))


if __name__ == "__main__":
    main()
