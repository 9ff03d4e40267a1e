"""One masked NLL for every learned model, in the shape of DPR's ``BiEncoderNllLoss.calc``.

Each step has a candidate set (the children of its state for the blend head, the candidate union
for tracer_plus) padded to a common width C. The loss is ``log_softmax`` of the step's logits over
its real candidates, then ``nll_loss`` on the gold candidate, averaged over the steps that have a
gold candidate. A step whose gold is not a candidate (gold ``IGNORE``) adds nothing to the loss
and no gradient; a batch without any gold candidate gives loss 0 with a zero gradient.

References: DPR (Karpukhin et al., 2020), ``dpr/models/biencoder.py``: ``BiEncoderNllLoss.calc ->
(loss, n_correct)``.

Example::

    loss, n_correct = masked_nll(logits, mask, gold)   # [B, C], [B, C] bool, [B] long
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100    # gold index of a step whose gold is not a candidate (F.nll_loss's ignore_index)
MASKED = -1e9    # logit of a padded candidate inside the loss (finite: no NaN in an all-padded row)


def masked_nll(logits: torch.Tensor, mask: torch.Tensor,
               gold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean NLL of the gold candidate, number of steps whose top candidate is the gold)``.

    Args:
        logits: ``[B, C]`` scores; values at padded positions are ignored.
        mask: ``[B, C]`` True for a real candidate.
        gold: ``[B]`` index of the gold candidate, ``IGNORE`` where the gold is not a candidate.
    """
    logits = logits.masked_fill(~mask, MASKED)                                  # padding masked, not looped
    gold = gold.to(logits.device, torch.long)
    valid = gold != IGNORE                                                      # [B]
    if not bool(valid.any()):
        return logits.sum() * 0.0, torch.zeros((), dtype=torch.long, device=logits.device)
    loss = F.nll_loss(F.log_softmax(logits, dim=1), gold, ignore_index=IGNORE, reduction="mean")
    n_correct = ((logits.argmax(1) == gold) & valid).sum()
    return loss, n_correct


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` over the real candidates of each row, ``[B, C]`` (``MASKED``-based at the padding)."""
    return torch.log_softmax(logits.masked_fill(~mask, MASKED), dim=1)
