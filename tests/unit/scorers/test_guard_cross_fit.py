"""The guard judges a narrowly leading model on cross-fitted scores (tracer.scorers.tracer_plus.fit): a
model's recall on the steps its weights were trained on overstates what it serves, most on few logs."""

from __future__ import annotations

import numpy as np
import torch
from plus_hand import plus

from tracer.learn.nll import IGNORE
from tracer.learn.trainer import TrainConfig
from tracer.scorers.tracer_plus import fit
from tracer.scorers.tracer_plus.fit import _fit_rows, cross_fitted
from tracer.scorers.tracer_plus.inner_folds import CandidateData

CFG = TrainConfig(lr=0.05, weight_decay=0.0, max_epochs=300, patience=300, batch_size=0, seed=0)


def recall_at(scores: torch.Tensor, gold: torch.Tensor, k: int) -> float:
    """The guard's count: the gold among the top k of its candidates, a gold that is not one a miss."""
    g = scores.gather(1, gold.clamp_min(0)[:, None])                                     # [S, 1]
    return float(((gold != IGNORE) & ((scores > g).sum(1) < k)).float().mean())


def noise(steps: int = 30, cands: int = 8, feats: int = 80, folds: int = 5, seed: int = 0) -> CandidateData:
    """Candidates whose features say nothing of the gold: what a model learns here is memorised."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(steps, cands, feats, generator=g)                                 # [S, C, F]
    return CandidateData(feats, torch.ones(steps, cands, dtype=torch.bool),
                         torch.randint(0, cands, (steps,), generator=g), torch.arange(steps) % folds)


def signal(steps: int = 30, cands: int = 8, folds: int = 5, seed: int = 0) -> CandidateData:
    """Candidates whose first feature marks the gold (plus noise): what a model learns here carries over."""
    data = noise(steps, cands, 4, folds, seed)
    data.feats[torch.arange(steps), data.gold, 0] += 5.0
    return data


def test_a_model_that_memorised_noise_leads_in_sample_and_not_cross_fitted():
    data = noise()
    model = _fit_rows(data, data.covered, "linear", 8, CFG, 300, None)  # as served: trained on every step
    with torch.no_grad():
        inside = recall_at(model.scores(data.feats, data.mask), data.gold, 1)
    crossed, gold = cross_fitted(data, "linear", 8, CFG, 300)
    assert torch.equal(gold, data.gold)                          # every fold has others to train on
    outside = recall_at(crossed, gold, 1)
    chance = 1 / 8
    assert inside > 0.9 and outside < chance + 0.1, (inside, outside)


def test_cross_fitted_scores_of_a_learnable_signal_stay_high():
    data = signal(steps=60)
    crossed, gold = cross_fitted(data, "linear", 8, CFG, 100)
    assert recall_at(crossed, gold, 1) > 0.9
    assert torch.isfinite(crossed).all()                         # every row scored by a model without it


def test_each_fold_is_scored_by_a_model_trained_on_the_others_alone():
    data = signal(steps=20, folds=2)
    crossed, _ = cross_fitted(data, "linear", 8, CFG, 50)
    for f in (0, 1):
        held = data.fold == f
        alone = _fit_rows(data, ~held, "linear", 8, CFG, 50, None)
        with torch.no_grad():
            assert torch.equal(crossed[held], alone.scores(data.feats[held], data.mask[held]).float())


def test_a_fold_with_no_other_covered_fold_is_a_miss():
    data = signal(steps=10, folds=2)
    data.gold[data.fold == 1] = IGNORE                           # only fold 0 covered: nothing to train on
    crossed, gold = cross_fitted(data, "linear", 8, CFG, 20)
    assert (gold == IGNORE).all() and recall_at(crossed, gold, 5) == 0.0
    assert np.isneginf(crossed.numpy()).all()


def test_the_fit_asks_the_cross_fitted_models_only_where_the_lead_is_narrow(monkeypatch, tiny_trajs,
                                                                             tiny_resources):
    """In sample the model leads on the hand corpus; with any lead counted narrow the guard judges it again
    on cross-fitted scores and says so (``guard_cross_fitted``), with any lead decisive it does not."""

    def fitted(decisive: float):
        monkeypatch.setattr(fit, "DECISIVE_LEAD", decisive)
        sc = plus(tiny_resources, zero_shot={"kind": "vector", "guard": True, "k": 1})
        sc.fit(tiny_trajs, tiny_resources)
        return sc.history

    inside, narrow = fitted(-np.inf), fitted(np.inf)
    assert inside["serves"] == "model" and "guard_cross_fitted" not in inside
    assert narrow["guard_cross_fitted"] is True
    assert narrow["guard_model_recall"] <= inside["guard_model_recall"]
    assert narrow["guard_zero_shot_recall"] == inside["guard_zero_shot_recall"]
