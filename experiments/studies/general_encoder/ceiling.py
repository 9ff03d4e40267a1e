"""How far another candidate source can reach: a run's recall@j on the steps where a model did without it.

    python -m experiments.studies.general_encoder.ceiling RUN --unseen-in HOLDOUT_RUN [--at 3 5]
    python -m experiments.studies.general_encoder.ceiling RUN --uncovered-in TRACER_PLUS_RUN [--at 10]

``--unseen-in``: the steps whose gold a held-out-tools run of the same dataset and seed never saw called
(its ``gold_seen``). With ``RUN`` a zero-shot ranking (``tracer_plus_minilm_n0``: what the slots draw from),
its recall@j bounds the slots of ``novel=j``, which only look at the zero-shot top j.
``--uncovered-in``: a tracer_plus run's misses whose gold was not among its candidates (``in_candidates`` 0:
no trie proposed it and the vector top m missed it). With ``RUN`` a BM25 run, its recall@m bounds what a
lexical candidate key of m tools would add to the candidates (the model must still rank them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tracer.eval.outputs import read_steps


def unseen_steps(holdout: Path) -> list[tuple]:
    return [(r.fold, r.trajectory_id, r.step) for r in read_steps(holdout / "steps.jsonl")
            if r.gold_seen is False]


def uncovered_misses(run: Path) -> list[tuple]:
    return [(r.fold, r.trajectory_id, r.step) for r in read_steps(run / "steps.jsonl")
            if not r.correct and r.extra.get("in_candidates") == 0.0]


def recall_on(run: Path, keys: list[tuple], at: int) -> int:
    """How many of ``keys``' steps ``run`` ranks the gold of in its top ``at``."""
    ranked = {(r.fold, r.trajectory_id, r.step): r.gold_rank for r in read_steps(run / "steps.jsonl")}
    return sum((ranked[k] or at + 1) <= at for k in keys)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--unseen-in", type=Path, dest="holdout")
    which.add_argument("--uncovered-in", type=Path, dest="model")
    ap.add_argument("--at", type=int, nargs="+", default=[3, 5])
    args = ap.parse_args(argv)
    keys, what = ((unseen_steps(args.holdout), "unseen steps") if args.holdout else
                  (uncovered_misses(args.model), "misses without the gold among the candidates"))
    for j in args.at:
        hits = recall_on(args.run, keys, j)
        print(f"recall@{j} on {len(keys)} {what}: {hits} ({hits / max(len(keys), 1):.3f})")


if __name__ == "__main__":
    main()
