"""The blend head (tracer/learn/blend_head.py): its loss against F.cross_entropy, gradients (gradcheck in
double, none from padded rows), the bounds of w and T on extreme inputs, and the fixed blend it starts
as. What it learns when fitted: test_blend.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from builders import BLEND_HEAD as HEAD

from tracer.learn.blend_head import FEATURES, IGNORE, BlendHead


def _random_head(dtype=torch.float32, seed=0, t_floor=0.05):
    g = torch.Generator().manual_seed(seed)
    head = BlendHead(len(FEATURES), t_floor).to(dtype)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
    return head


def _batch(dtype=torch.float32):
    """B = 4 steps, C = 3: widths 3, 2, 1 and 3; the last step's gold is not a child."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    g = torch.Generator().manual_seed(1)
    log_p = torch.log(torch.rand(4, 3, generator=g, dtype=dtype)).masked_fill(~mask, float("-inf"))
    log_l = torch.log(torch.rand(4, 3, generator=g, dtype=dtype)).masked_fill(~mask, float("-inf"))
    feats = torch.randn(4, len(FEATURES), generator=g, dtype=dtype)
    gold = torch.tensor([2, 1, 0, IGNORE])
    return log_p, log_l, mask, feats, gold


# ---- the head ------------------------------------------------------------------------------------
def test_loss_equals_cross_entropy_on_blended_scores():
    head = _random_head()
    log_p, log_l, mask, feats, gold = _batch()
    scores, loss, n_correct = head(log_p, log_l, mask, feats, gold)
    w, t = head.wt(feats)
    expect = (w[:, None] * log_p + (1 - w[:, None]) * log_l) / t[:, None]
    torch.testing.assert_close(scores[mask], expect[mask])
    assert torch.isneginf(scores[~mask]).all()
    torch.testing.assert_close(loss, F.cross_entropy(scores, gold, ignore_index=IGNORE))
    assert int(n_correct) == int(((scores.argmax(1) == gold) & (gold != IGNORE)).sum())
    # the step whose gold is not a child carries no gradient
    g_all = torch.autograd.grad(loss, list(head.parameters()))
    _, loss3, _ = head(log_p[:3], log_l[:3], mask[:3], feats[:3], gold[:3])
    for a, b in zip(g_all, torch.autograd.grad(loss3, list(head.parameters()))):
        torch.testing.assert_close(a, b)
    # no gold in the batch: zero loss that still backpropagates, no NaN
    _, loss0, n0 = head(log_p, log_l, mask, feats, torch.full_like(gold, IGNORE))
    assert float(loss0.detach()) == 0.0 and int(n0) == 0


def test_padded_rows_and_inputs_give_no_nan_gradients():
    head = _random_head()
    log_p, log_l, mask, feats, gold = _batch()
    mask = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])  # a step with no children at all
    log_p = torch.cat([log_p, torch.full((1, 3), float("-inf"))])
    log_l = torch.cat([log_l, torch.full((1, 3), float("-inf"))])
    feats, gold = torch.cat([feats, torch.zeros(1, len(FEATURES))]), torch.cat([gold, torch.tensor([IGNORE])])
    _, loss, _ = head(log_p, log_l, mask, feats, gold)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in head.parameters())


def test_gradcheck_both_heads_double():
    head = _random_head(torch.double)
    log_p, log_l, mask, feats, gold = _batch(torch.double)
    names = [n for n, _ in head.named_parameters()]
    assert names == ["w_head.weight", "w_head.bias", "t_head.weight", "t_head.bias"]
    params = tuple(p.detach().clone().requires_grad_(True) for p in head.parameters())

    def loss_of(*ps):
        state = {**dict(zip(names, ps)), **dict(head.named_buffers())}
        return torch.func.functional_call(head, state, (log_p, log_l, mask, feats, gold))[1]

    assert torch.autograd.gradcheck(loss_of, params, eps=1e-6, atol=1e-5)
    grads = torch.autograd.grad(loss_of(*params), params)
    assert grads[0].abs().sum() > 0 and grads[2].abs().sum() > 0  # both heads receive gradient


@pytest.mark.parametrize("scale", [1e3, 1e30])
def test_w_in_open_unit_interval_and_t_above_floor_for_extreme_inputs(scale):
    head = _random_head(t_floor=0.1)
    with torch.no_grad():
        head.w_head.weight.mul_(100)
        head.t_head.weight.mul_(100)
    feats = torch.tensor([[1.0] * 5, [-1.0] * 5, [1, -1, 1, -1, 1], [-1, 1, -1, 1, -1]]) * scale
    w, t = head.wt(feats)
    assert ((w > 0) & (w < 1)).all(), w
    assert ((t >= 0.1) & torch.isfinite(t)).all(), t
    assert torch.isfinite(1 / t).all()
    scores, _, _ = head(*_batch()[:3], feats)
    assert torch.isfinite(scores[_batch()[2]]).all()


def test_initial_head_is_the_fixed_blend():
    head = BlendHead(len(FEATURES), HEAD["t_floor"])
    log_p, log_l, mask, feats, _ = _batch()
    w, t = head.wt(feats)
    torch.testing.assert_close(w, torch.full_like(w, 0.5))
    torch.testing.assert_close(t, torch.full_like(t, 0.5))
    scores, _, _ = head(log_p, log_l, mask, feats)
    torch.testing.assert_close(scores[mask], (log_p + log_l)[mask])
