"""The transformer's ranking loss: sentence-transformers' MultipleNegativesRankingLoss on a batch's
embeddings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tracer.learn.encoders.losses.batch import EmbeddedBatch

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


class MultipleNegativesRanking:
    """Cross-entropy of anchor i over the batch's B positives, logits ``scale * cos(anchor, positive)``,
    target i: the other tools in the batch are the negatives (sentence-transformers'
    ``MultipleNegativesRankingLoss``, whose ``compute_loss_from_embeddings`` this calls on the model's raw
    embeddings).

    Args:
        model: the model being trained (the sentence-transformers loss keeps a reference to it).
        scale: the inverse temperature.
    """

    def __init__(self, model: SentenceTransformer, scale: float):
        # imported here: the full sentence-transformers package costs seconds at import, paid only when
        # training
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

        self.loss = MultipleNegativesRankingLoss(model, scale=scale)

    def __call__(self, batch: EmbeddedBatch) -> torch.Tensor:
        return self.loss.compute_loss_from_embeddings([batch.anchors, batch.positives],
                                                      torch.empty(0, device=batch.anchors.device))
