"""Would a per-fit choice of ``zero_shot.candidates`` pick the better variant? (Tried 2026-12-07, not built.)

    OMP_NUM_THREADS=1 python -m experiments.studies.learning_curves.choose_candidates tau2 10 all

Per outer fold (the learning curves' folds and arrival order) and N, tracer_plus is fitted on the first N
training trajectories twice: as it is and with the fusion among its candidates (``tracer_plus_zscand``). Each
fit's candidate data is captured and its candidate model cross-fitted over the inner folds (a model trained
without each inner fold scores that fold's steps); the variant with the higher cross-fitted recall@5 is the
choice. Printed per fold: both estimates, both variants' recall@5 on the held-out steps, and the choice; then
the mean held-out recall@5 of the chosen variant and of each variant alone, and how often the choice was the
better, the worse or a tie.
"""

from __future__ import annotations

import argparse
from unittest import mock

import numpy as np
import torch

from experiments.studies.learning_curves.learning_curves import load, make_scorer, recalls
from tracer.core.folds import arrival_order, kfold
from tracer.learn.nll import IGNORE
from tracer.scorer_base.resources import training_steps
from tracer.scorers.tracer_plus import fit
from tracer.scorers.tracer_plus.inner_folds import CandidateData

VARIANTS = ("tracer_plus", "tracer_plus_zscand")


def rows(data: CandidateData, keep: torch.Tensor) -> CandidateData:
    return CandidateData(data.feats[keep], data.mask[keep], data.gold[keep], data.fold[keep])


def cross_fitted_recall(data: CandidateData, args: tuple, kwargs: dict, k: int = 5) -> float:
    """recall@k of the training steps, each inner fold scored by a model trained without it (the fit's own
    ``train_model`` arguments); a gold outside the candidates is a miss."""
    hits = np.zeros(len(data), dtype=bool)
    for f in sorted(set(data.fold.tolist())):
        train = rows(data, data.fold != f)
        if not bool(train.covered.any()):
            continue
        model, _ = fit.train_model(train, *args, **kwargs)
        held = (data.fold == f).nonzero().squeeze(1)                                        # [h]
        with torch.no_grad():
            s = model.scores(data.feats[held], data.mask[held]).cpu()                       # [h, C]
        s = torch.where(data.mask[held], s, torch.tensor(-float("inf")))
        gold = data.gold[held]                                                              # [h]
        covered = gold != IGNORE
        above = (s > s.gather(1, gold.clamp_min(0)[:, None])).sum(1)                        # [h]
        hits[held.numpy()] = (covered & (above < k)).numpy()
    return float(hits.mean()) if len(hits) else 0.0


def fit_and_estimate(name: str, trajectories, res, steps, dataset: str) -> tuple[float, float]:
    """(cross-fitted recall@5 on the training steps, recall@5 on ``steps``) of variant ``name``."""
    seen: dict = {}
    real = fit.train_model

    def capture(data, *args, **kwargs):
        seen.update(data=data, args=args, kwargs=kwargs)
        return real(data, *args, **kwargs)

    scorer = make_scorer(name, None, dataset)
    with mock.patch.object(fit, "train_model", side_effect=capture):
        scorer.fit(trajectories, res)
    estimate = cross_fitted_recall(seen["data"], seen["args"], seen["kwargs"]) if seen else 0.0
    return estimate, recalls(scorer, steps, res, 5)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", choices=["bfcl", "tau2", "apibank"])
    ap.add_argument("ns", nargs="+", help="training trajectories (arrival order), or all")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ds, res = load(args.dataset, args.seed)
    table: dict[str, list[tuple]] = {n: [] for n in args.ns}
    for split in kfold(ds.trajectories, args.folds, args.seed):
        order = arrival_order(split.train, args.seed, split.fold)
        steps = training_steps(split.test, ds.registry, True)
        for n in args.ns:
            first = order if n == "all" else order[:int(n)]
            est = {v: fit_and_estimate(v, first, res, steps, args.dataset) for v in VARIANTS}
            pick = VARIANTS[1] if est[VARIANTS[1]][0] > est[VARIANTS[0]][0] else VARIANTS[0]
            table[n].append((est[VARIANTS[0]][1], est[VARIANTS[1]][1], est[pick][1]))
            print(f"fold {split.fold} N {n}: " + ", ".join(
                f"{v} estimate {e:.3f} held-out {t:.3f}" for v, (e, t) in est.items()) + f"; picks {pick}",
                flush=True)
    for n, cells in table.items():
        plain, zscand, chosen = np.array(cells).T
        better = int(sum(c == max(p, z) and p != z for p, z, c in cells))
        worse = int(sum(c == min(p, z) and p != z for p, z, c in cells))
        ties = len(cells) - better - worse
        print(f"N {n}: chosen {chosen.mean():.3f}, tracer_plus {plain.mean():.3f}, tracer_plus_zscand "
              f"{zscand.mean():.3f}; the better {better}, the worse {worse}, a tie {ties}")


if __name__ == "__main__":
    main()
