"""How far the novel slots can reach: a run's recall@j on the steps whose gold another run never saw called.

    python -m experiments.studies.general_encoder.ceiling RUN --unseen-in HOLDOUT_RUN [--at 3 5]

``RUN`` is a zero-shot ranking (``tracer_plus_minilm_n0``: what the slots draw from), ``HOLDOUT_RUN`` a
held-out-tools run of the same dataset and seed (its ``gold_seen`` marks the steps). The slots of
``novel=j`` only look at the zero-shot top j, so its recall@j on those steps bounds theirs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tracer.eval.outputs import read_steps


def recall_on_unseen(run: Path, holdout: Path, at: int) -> tuple[int, int]:
    """``(steps whose gold run ranks in its top at, steps)`` over holdout's unseen-gold steps."""
    ranked = {(r.fold, r.trajectory_id, r.step): r.gold_rank for r in read_steps(run / "steps.jsonl")}
    keys = [(r.fold, r.trajectory_id, r.step) for r in read_steps(holdout / "steps.jsonl")
            if r.gold_seen is False]
    return sum((ranked[k] or at + 1) <= at for k in keys), len(keys)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--unseen-in", type=Path, required=True, dest="holdout")
    ap.add_argument("--at", type=int, nargs="+", default=[3, 5])
    args = ap.parse_args(argv)
    for j in args.at:
        hits, n = recall_on_unseen(args.run, args.holdout, j)
        print(f"recall@{j} on {n} unseen steps: {hits} ({hits / n:.3f})")


if __name__ == "__main__":
    main()
