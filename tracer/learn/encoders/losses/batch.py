"""What a loss term reads: one batch's embeddings, and how the terms are summed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class EmbeddedBatch:
    """One batch of pairs as the model embedded them.

    Args:
        anchors: ``[B, d]`` the contexts.
        positives: ``[B, d]`` their gold tools' texts (row i is anchor i's).
        unit: whether the rows are L2-normalised already (a static table's mean rows) or raw model outputs.
        partner_rows: the rows of ``anchors`` that have a partner context (another context that called the
            same tool, :func:`tracer.learn.encoders.pairs.context_partners`), in order; None when no term
            asked for them or fewer than two anchors have one.
        partners: ``[B', d]`` those partners, row j the partner of anchor ``partner_rows[j]``.
    """

    anchors: torch.Tensor
    positives: torch.Tensor
    unit: bool
    partner_rows: torch.Tensor | list[int] | None = None
    partners: torch.Tensor | None = None


class EncoderLoss(Protocol):
    """A loss term: the batch's scalar loss, or None when the batch holds nothing for it."""

    def __call__(self, batch: EmbeddedBatch) -> torch.Tensor | None: ...


def total(terms: Sequence[EncoderLoss], batch: EmbeddedBatch) -> torch.Tensor:
    """The sum of the terms, in order (the first is the ranking loss, always present)."""
    loss = None
    for term in terms:
        value = term(batch)
        if value is not None:
            loss = value if loss is None else loss + value
    if loss is None:
        raise ValueError("no loss term applied to the batch")
    return loss
