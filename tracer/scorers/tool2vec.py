"""``tool2vec``: vector search over usage-enriched tool vectors (Tool2Vec, Moon et al. 2024): each tool's
description vector plus the contexts of the logged steps that called it (:mod:`tracer.scorer_base.usage`).
With no logs it is vector search; it learns nothing but those sums, no weight, so it is the baseline for "the
logs' own phrasings, without a model".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict

import numpy as np
import torch

from tracer.core.context import ContextRendering
from tracer.core.types import Step, Trajectory
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.ranking import no_proposal
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources, fallback_scores, training_steps
from tracer.scorer_base.usage import check_prior, context_sums, usage_scores, usage_vectors


class Tool2VecScorer(ScorerBase):
    """Vector search over usage-enriched tool vectors (module docstring); values in
    ``tracer/configs/scorer/tool2vec.yaml``. Serving, its usage vectors are its learned part: an online update
    holds the new logs and a refit (``Retriever.updater.refit()``, or every ``refit_every``) rebuilds them.

    Args:
        name: registry name.
        context: rendering of the query, and of the logged contexts added to the tool vectors.
        prior: weight of a tool's description vector against its calls' contexts (> 0).
    """

    learned_part = "table"  # what a refit learns again: one assignment swaps both arrays

    def __init__(self, *, name: str, context: Mapping, prior: float):
        self.name, self.prior = name, check_prior(prior, "tool2vec")
        self.rendering = ContextRendering.from_config(context)
        self.res: Resources | None = None
        # (called [K] registry ids of the tools with usage, their usage vectors [K, d] float64)
        self.table: tuple[np.ndarray, np.ndarray] = (np.zeros(0, dtype=np.int64), np.zeros((0, 0)))

    def config(self) -> dict:
        return {"name": self.name, "context": asdict(self.rendering), "prior": self.prior}

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        """Add the contexts of the training steps to the vectors of the tools they called; no training step
        leaves vector search."""
        steps = training_steps(trajectories, res.registry, self.successful_only)
        ctx = res.embed(steps, self.rendering) if steps else torch.zeros(0, res.tool_index.dim)  # [S, d]
        sums = context_sums(ctx, res.tool_ids([s.gold for s in steps]), len(res.registry))      # [N, d]
        self.table = usage_vectors(res.tool_index.vectors, sums.numpy(), self.prior)
        self.res = res
        return FitReport(self.name, len(trajectories), len(steps), 0.0)

    def score_embedded(self, steps: Sequence[Step], ctx: torch.Tensor) -> Scores:
        """``ctx [B, d]``: the steps' contexts under :attr:`rendering`."""
        self._check_fitted()
        b, n = len(steps), len(self.res.registry)
        scores = usage_scores(fallback_scores(self.res, ctx), ctx, *self.table)           # [B, N]
        return Scores(primary=no_proposal(b, n), fallback=scores, fell_back=torch.ones(b, dtype=torch.bool))

    def describe(self) -> dict:
        return {"scorer": self.name, "tools_called": len(self.table[0]),
                "ranking": f"cosine with each tool's description vector (weight {self.prior:g}) plus the "
                "contexts that called it",
                "context": asdict(self.rendering)}
