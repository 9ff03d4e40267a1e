"""What the guard chose at one N, and what each ranking scores on the held-out tasks.

    OMP_NUM_THREADS=1 python -m experiments.studies.learning_curves.guard_at_n tau2 10

Per outer fold (the learning curves' folds and arrival order), tracer_plus is fitted on the first N training
trajectories; printed: what the guard serves, its out-of-fold recall@5 for the model and the zero-shot fusion
(``guard_*``), and recall@5 on the fold's held-out steps of what is served, of the model and of the fusion
(``score_embedded(serving=...)``), beside ``tool2vec`` fitted on the same N.
"""

from __future__ import annotations

import argparse

import numpy as np

from experiments.studies.learning_curves.learning_curves import load, make_scorer
from tracer.core.folds import arrival_order, kfold
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import training_steps


def recall(scores, gold: list[int]) -> float:
    """recall@5 of ``scores`` against each step's gold registry id."""
    return float(np.mean([g in p for g, p in zip(gold, finalize(scores, 5).presented)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", choices=["bfcl", "tau2", "apibank"])
    ap.add_argument("n", type=int, help="training trajectories (arrival order)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ds, res = load(args.dataset, args.seed)
    means: dict[str, list[float]] = {}
    for split in kfold(ds.trajectories, args.folds, args.seed):
        order = arrival_order(split.train, args.seed, split.fold)
        steps = training_steps(split.test, ds.registry, True)
        gold = [res.registry.id(s.gold) for s in steps]
        plus = make_scorer("tracer_plus")
        plus.fit(order[:args.n], res)
        mem, query = plus.embed(steps)
        t2v = make_scorer("tool2vec")
        t2v.fit(order[:args.n], res)
        row = {"served": recall(plus.score_embedded(steps, mem, query), gold),
               "model": recall(plus.score_embedded(steps, mem, query, serving="model"), gold),
               "fusion": recall(plus.score_embedded(steps, mem, query, serving="zero_shot"), gold),
               "tool2vec": recall(t2v.score(steps), gold)}
        guard = {k: round(v, 3) for k, v in plus.history.items() if k.startswith("guard_")}
        print(f"fold {split.fold}: serves {plus.history.get('serves')}, {guard},",
              ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
        for k, v in row.items():
            means.setdefault(k, []).append(v)
    print("mean over folds:", ", ".join(f"{k} {np.mean(v):.3f}" for k, v in means.items()))


if __name__ == "__main__":
    main()
