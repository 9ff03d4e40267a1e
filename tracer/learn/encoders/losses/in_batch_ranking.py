"""The static table's ranking loss: each context against the batch's tool texts, on unit vectors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tracer.learn.encoders.losses.batch import EmbeddedBatch


class InBatchRanking:
    """Cross-entropy of anchor i over the batch's B positives, logits ``scale * a_i . p_j`` of unit vectors,
    target i (the ranking of :class:`MultipleNegativesRanking`, for rows that are unit already: a static
    table's mean rows, so nothing is normalised again).

    Args:
        scale: the inverse temperature.
    """

    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, batch: EmbeddedBatch) -> torch.Tensor:
        if not batch.unit:
            raise ValueError("InBatchRanking takes unit vectors; a transformer's raw outputs take "
                             "MultipleNegativesRanking")
        a, p = batch.anchors, batch.positives                                    # [B, d] each
        return F.cross_entropy(self.scale * a @ p.T, torch.arange(len(a)))       # [B, B] logits
