"""The usage vectors of tracer_plus's zero-shot fusion (``zero_shot.usage``, :mod:`tracer.scorer_base.usage`),
read off the index: each called tool's description vector plus the sum of the memory contexts that called
it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tracer.core.folds import row_folds
from tracer.core.types import Step
from tracer.scorer_base.usage import context_sums, usage_scores, usage_vectors


def inner_usage_scores(steps: Sequence[Step], gold_ids: torch.Tensor, mem_ctx: torch.Tensor,
                       query: torch.Tensor, vec: torch.Tensor, tools: np.ndarray, prior: float,
                       inner_folds: int, seed: int) -> torch.Tensor:
    """``vec [S, N]`` with each step's called tools scored by usage vectors built from the other inner folds
    only (the folds of :func:`inner_fold_candidates` with the same ``inner_folds`` and ``seed``), from the
    memory contexts ``mem_ctx [S, d]`` of the steps that called them, against the step's ``query [S, d]``:
    what ``zero_shot.usage`` gives a step the index never saw. Fewer than two groups: ``vec``."""
    out = vec.clone()
    groups = [s.group for s in steps]
    if len(set(groups)) < 2:
        return out
    for _, seen, held in row_folds(groups, inner_folds, seed):
        sums = context_sums(mem_ctx[seen.to(mem_ctx.device)], gold_ids[seen], vec.shape[1])   # [N, d]
        called, u = usage_vectors(tools, sums.numpy(), prior)
        out[held] = usage_scores(vec[held], query[held.to(query.device)], called, u)
    return out


class UsageInput:
    """``prior``: the description vectors' weight (None: off). Holds the vectors of one (index, tool index)
    pair, built when the scorer attaches its index (:meth:`refresh`; scoring changes nothing) and again should
    either have changed since (a tool renamed under the same index)."""

    def __init__(self, prior: float | None):
        self.prior = prior
        self._cached: tuple | None = None  # (index, tool index, called [K], usage vectors [K, d])

    def refresh(self, scorer) -> None:
        """Build the vectors over ``scorer``'s index and tool index (a no-op when off or already current)."""
        idx, tools = scorer.index, scorer.res.tool_index
        if self.prior is not None and (self._cached is None or self._cached[0] is not idx
                                       or self._cached[1] is not tools):
            sums = idx.tool_mass64[:, None] * idx.tool_memory64                                 # [N, d]
            self._cached = (idx, tools, *usage_vectors(tools.vectors, sums, self.prior))

    def table(self, scorer) -> tuple[np.ndarray, np.ndarray] | None:
        """``(called [K], u [K, d] float64)`` over ``scorer``'s index and tool index; None when off."""
        if self.prior is None:
            return None
        self.refresh(scorer)
        return self._cached[2:]

    def scores(self, vec: torch.Tensor, query: torch.Tensor, scorer) -> torch.Tensor:
        """``[B, N]`` the fusion's vector input: ``vec`` with the called tools' usage scores (``vec`` when
        off)."""
        table = self.table(scorer)
        return vec if table is None else usage_scores(vec, query, *table)

    def inner(self, steps: Sequence[Step], gold_ids: torch.Tensor, mem_ctx: torch.Tensor, query: torch.Tensor,
              vec: torch.Tensor, tools: np.ndarray, inner_folds: int, seed: int) -> torch.Tensor:
        """The training steps' fusion input ``[S, N]``: :func:`inner_usage_scores` (``vec`` when off)."""
        return vec if self.prior is None else inner_usage_scores(steps, gold_ids, mem_ctx, query, vec, tools,
                                                                 self.prior, inner_folds, seed)
