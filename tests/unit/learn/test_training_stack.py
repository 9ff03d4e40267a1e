"""The shared training stack (tracer/learn/nll.py, standardise.py, trainer.py, oof.py) against exact
references: F.cross_entropy, losses worked out by hand, and re-running the loop for the best epoch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tracer.core.folds import row_folds
from tracer.learn.nll import IGNORE, masked_nll
from tracer.learn.oof import out_of_fold, pad_cat
from tracer.learn.standardise import fit_stats, keep_mask, register_stats, standardise
from tracer.learn.trainer import TrainConfig, train, weight_penalty


# ---- masked NLL ----------------------------------------------------------------------------------
def test_unmasked_nll_equals_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, generator=g, dtype=torch.float64)
    gold = torch.tensor([0, 3, 1, 2, 2, 0])
    loss, n_correct = masked_nll(logits, torch.ones(6, 4, dtype=torch.bool), gold)
    torch.testing.assert_close(loss, F.cross_entropy(logits, gold), rtol=0, atol=1e-12)
    assert int(n_correct) == int((logits.argmax(1) == gold).sum())


def test_masked_nll_by_hand():
    # row 0: candidates {1.0, 2.0}, the third column is padding (its huge logit must not count); gold = 1:
    #   -log(e^2 / (e^1 + e^2)) = log(1 + e^-1) = 0.313261687518...; argmax is the gold: 1 correct
    # row 1: gold not a candidate (IGNORE): no loss, no gradient, not counted
    # row 2: candidates {0, 0, 0}, gold = 2: log 3; argmax is column 0, not the gold
    logits = torch.tensor([[1.0, 2.0, 100.0], [5.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64,
                          requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True], [True, True, True]])
    loss, n_correct = masked_nll(logits, mask, torch.tensor([1, IGNORE, 2]))
    assert float(loss.detach()) == pytest.approx((math.log1p(math.exp(-1)) + math.log(3)) / 2, rel=1e-12)
    assert int(n_correct) == 1
    loss.backward()
    assert logits.grad[0, 2] == 0 and (logits.grad[1] == 0).all()
    # d loss / d logit = (softmax - onehot) / 2 steps
    p = 1 / (1 + math.e)
    torch.testing.assert_close(logits.grad[0, :2], torch.tensor([p, -p], dtype=torch.float64) / 2)
    torch.testing.assert_close(logits.grad[2], torch.tensor([1 / 3, 1 / 3, -2 / 3], dtype=torch.float64) / 2)


def test_a_batch_without_gold_gives_zero_loss_and_zero_gradient():
    logits = torch.randn(2, 3, requires_grad=True)
    loss, n_correct = masked_nll(logits, torch.ones(2, 3, dtype=torch.bool), torch.tensor([IGNORE, IGNORE]))
    loss.backward()
    assert float(loss.detach()) == 0.0 and int(n_correct) == 0 and (logits.grad == 0).all()


# ---- standardiser ------------------------------------------------------------------------------
def test_standardiser_by_hand():
    m = nn.Module()
    register_stats(m, 3, keep=torch.tensor([1.0, 1.0, 0.0]))
    rows = torch.tensor([[1.0, 5.0, 2.0], [3.0, 5.0, 4.0]])
    fit_stats(m, rows)
    # mean (2, 5, 3); biased SD (1, 0 -> 1 for a constant feature, 1)
    assert m.mean.tolist() == [2.0, 5.0, 3.0] and m.std.tolist() == [1.0, 1.0, 1.0]
    z = standardise(torch.tensor([[4.0, 6.0, 9.0], [100.0, -100.0, 0.0]]), m.mean, m.std, m.keep)
    assert z.tolist() == [[2.0, 1.0, 0.0], [8.0, -8.0, 0.0]]  # dropped feature 0; clipped to +-8 SD
    fit_stats(m, rows[:0])  # no rows: mean 0, SD 1
    assert m.mean.tolist() == [0.0] * 3 and m.std.tolist() == [1.0] * 3


def test_standardiser_accumulates_in_float64_when_asked():
    rows = 1e4 + torch.rand(1000, 2, generator=torch.Generator().manual_seed(0))        # float32
    a, b = nn.Module(), nn.Module()
    register_stats(a, 2)
    register_stats(b, 2)
    fit_stats(a, rows, accumulate=torch.float64)
    fit_stats(b, rows)
    assert torch.equal(a.mean, rows.double().mean(0).float()) and torch.equal(b.mean, rows.mean(0))
    assert torch.equal(a.std, rows.double().std(0, unbiased=False).float())
    assert torch.equal(b.std, rows.std(0, unbiased=False))
    assert a.mean.dtype == b.mean.dtype == torch.float32


def test_keep_mask_by_name_index_and_group():
    names = ("a.x", "a.y", "b.x")
    assert keep_mask(names, ["a.y"]).tolist() == [1.0, 0.0, 1.0]
    assert keep_mask(names, [2]).tolist() == [1.0, 1.0, 0.0]
    assert keep_mask(names, ["x"], groups=("x", "y"),
                     groups_of=lambda n: {n.split(".")[1]}).tolist() == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError,
                       match=r"unknown feature groups or names to drop \['z', 7\]; features: a.x, a.y, b.x"):
        keep_mask(names, ["z", 7])


# ---- out-of-fold builder -----------------------------------------------------------------------
def test_out_of_fold_scores_each_fold_against_the_others_only():
    groups = [f"g{i % 5}" for i in range(20)]
    parts = out_of_fold(groups, 3, 7, build=lambda seen, f: (f, {groups[i] for i in seen.tolist()}),
                        score=lambda built, held, f: (f, built, {groups[i] for i in held.tolist()}))
    assert [f for f, _, _ in parts] == [f for f, _, _ in row_folds(groups, 3, 7)]
    for f, (built_for, seen), held in parts:
        assert built_for == f  # build learns which fold it serves (a per-fold encoder needs it)
        assert seen and held and not seen & held and seen | held == set(groups)


def test_pad_cat_pads_the_candidate_dimension():
    a, b = torch.ones(1, 2, 3), torch.ones(2, 1, 3)
    out = pad_cat([a, b], 2, 0.0)
    assert out.shape == (3, 2, 3) and out[1:, 1].eq(0).all() and out[0].eq(1).all()
    m = pad_cat([torch.ones(1, 1, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool)], 2, False)
    assert m.tolist() == [[True, False], [True, True]]


# ---- trainer -----------------------------------------------------------------------------------
class Scale(nn.Module):
    """s = weight * x over two candidates, plus a bias added to candidate 0 (not penalised)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):  # x [B, 2] -> [B, 2]
        return self.weight * x + torch.cat([self.bias, torch.zeros(1)])


def _problem(n=64, seed=0):
    """Training data always favour candidate 0 (the weight grows without bound); the validation data
    favour it 3 times in 4, so their NLL first falls, then rises: early stopping has a best epoch."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * torch.tensor([1.0, 0.0]) + torch.tensor([0.5, 0.0])
    xv = torch.rand(n, 2, generator=g) * torch.tensor([1.0, 0.0]) + torch.tensor([0.5, 0.0])
    return x, torch.zeros(n, dtype=torch.long), xv, torch.tensor([0, 0, 0, 1] * (n // 4))


def _fit(model, x, gold, xv, gv, cfg, validate=True):
    mask = torch.ones(len(x), 2, dtype=torch.bool)

    def batch_loss(idx):
        xi, gi = (x, gold) if idx is None else (x[idx], gold[idx])
        return masked_nll(model(xi), mask[: len(xi)], gi)[0]

    val = (lambda: masked_nll(model(xv), mask, gv)) if validate else None
    return train(model, batch_loss, val, len(x), len(xv), cfg)


def test_weight_penalty_skips_biases():
    lin = nn.Linear(2, 1)
    with torch.no_grad():
        assert float(weight_penalty(lin)) == pytest.approx(float(lin.weight.pow(2).sum()), rel=1e-7)


def test_early_stopping_keeps_the_best_epoch():
    x, gold, xv, gv = _problem()
    cfg = TrainConfig(lr=0.2, weight_decay=0.0, max_epochs=300, patience=10, batch_size=0, seed=0)
    model = Scale()
    hist = _fit(model, x, gold, xv, gv, cfg)
    curve = hist["val_loss"]
    best = min(range(len(curve)), key=curve.__getitem__)
    assert 0 < best < len(curve) - 1 and hist["best_epoch"] == best and hist["best_val_loss"] == curve[best]
    # stopped `patience` epochs after the best
    assert hist["epochs"] == best + cfg.patience + 1 < cfg.max_epochs
    # the kept weights are the best epoch's: training afresh for best + 1 epochs gives them exactly
    again = Scale()
    _fit(again, x, gold, xv, gv, TrainConfig(0.2, 0.0, best + 1, 10, 0, 0), validate=False)
    assert torch.equal(model.weight, again.weight) and torch.equal(model.bias, again.bias)


def test_same_seed_same_weights_and_the_seed_orders_mini_batches():
    x, gold, xv, gv = _problem(seed=3)

    def weights(seed):
        model = Scale()
        _fit(model, x, gold, xv, gv, TrainConfig(0.05, 1e-3, 20, 50, 8, seed))
        return torch.cat([model.weight.detach(), model.bias.detach()])

    assert torch.equal(weights(1), weights(1))
    assert not torch.equal(weights(1), weights(2))
