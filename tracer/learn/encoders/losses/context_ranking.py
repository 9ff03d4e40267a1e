"""The context-to-context term: each context against the batch's partner contexts."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tracer.learn.encoders.losses.batch import EmbeddedBatch


class ContextRanking:
    """``weight`` times the cross-entropy of each partnered anchor over the batch's partner contexts, logits
    ``scale * cos``, its own partner (another training context that called the same tool) the target.

    tracer_plus compares a live context with past contexts (its edge and tool memories are mean contexts) as
    well as with tool texts, and the ranking loss trains only the second. A batch never holds a tool twice, so
    the other partners called other tools. A batch with fewer than two partnered anchors adds nothing.

    Args:
        weight: the term's weight beside the ranking loss.
        scale: the inverse temperature.
    """

    def __init__(self, weight: float, scale: float):
        self.weight, self.scale = weight, scale

    def __call__(self, batch: EmbeddedBatch) -> torch.Tensor | None:
        if batch.partners is None:
            return None
        a, c = batch.anchors[batch.partner_rows], batch.partners                 # [B', d] each
        if not batch.unit:
            a, c = F.normalize(a, dim=-1), F.normalize(c, dim=-1)
        return self.weight * F.cross_entropy(self.scale * a @ c.T,               # [B', B'] logits
                                             torch.arange(len(c), device=c.device))
