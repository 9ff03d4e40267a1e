"""The encoder trainers' loss terms (tracer/learn/encoders/losses/) against the cross-entropy written out
by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tracer.learn.encoders.losses import (
    ContextRanking,
    EmbeddedBatch,
    InBatchRanking,
    MultipleNegativesRanking,
    total,
)


def _batch(unit: bool, partners: bool = True) -> EmbeddedBatch:
    g = torch.Generator().manual_seed(0)
    a, p, c = (torch.randn(n, 8, generator=g) for n in (4, 4, 3))                 # [B, d], [B, d], [B', d]
    if unit:
        a, p, c = (F.normalize(x, dim=-1) for x in (a, p, c))
    return EmbeddedBatch(a, p, unit, [0, 2, 3] if partners else None, c if partners else None)


def test_in_batch_ranking_is_the_cross_entropy_of_each_anchor_over_the_batchs_tools():
    b = _batch(unit=True)
    # anchor i's tool is row i of the positives
    want = F.cross_entropy(20.0 * b.anchors @ b.positives.T, torch.tensor([0, 1, 2, 3]))
    assert torch.equal(InBatchRanking(20.0)(b), want)
    with pytest.raises(ValueError, match="unit vectors"):
        InBatchRanking(20.0)(_batch(unit=False))


def test_multiple_negatives_ranking_scales_the_cosines():
    b = _batch(unit=False)
    cos = F.normalize(b.anchors, dim=-1) @ F.normalize(b.positives, dim=-1).T              # [B, B]
    want = F.cross_entropy(20.0 * cos, torch.arange(4))
    torch.testing.assert_close(MultipleNegativesRanking(torch.nn.Identity(), 20.0)(b), want)


@pytest.mark.parametrize("unit", [True, False])
def test_the_context_term_ranks_each_partnered_anchor_over_the_partners(unit):
    b = _batch(unit)
    a, c = F.normalize(b.anchors[[0, 2, 3]], dim=-1), F.normalize(b.partners, dim=-1)   # [3, d] each
    want = 0.5 * F.cross_entropy(20.0 * a @ c.T, torch.arange(3))                       # row j's partner is j
    torch.testing.assert_close(ContextRanking(0.5, 20.0)(b), want)
    assert ContextRanking(0.5, 20.0)(_batch(unit, partners=False)) is None


def test_the_terms_are_summed_in_order_and_a_term_with_nothing_to_add_is_left_out():
    b, alone = _batch(unit=True), _batch(unit=True, partners=False)
    rank, ctx = InBatchRanking(20.0), ContextRanking(0.5, 20.0)
    assert torch.equal(total([rank, ctx], b), rank(b) + ctx(b))
    assert torch.equal(total([rank, ctx], alone), rank(alone))
    with pytest.raises(ValueError, match="no loss term"):
        total([ctx], alone)
