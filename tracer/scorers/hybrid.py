"""``hybrid``: vector search and BM25 fused by reciprocal rank, the zero-shot ranker that needs no logs.

Each input ranks the whole registry (``vector``: cosine of the embedded context with each tool's name and
description; ``bm25``: BM25 of the context's words against each tool's name, description and parameters,
:mod:`tracer.scorers.bm25`); a tool's fused score is ``sum_i 1 / (rrf_k + rank_i)`` (reciprocal rank fusion,
Cormack, Clarke and Buettcher, SIGIR 2009; ``rrf_k`` = 60 as there), ranks 1-based, ties by registry
position. Ranks, not scores, are fused: a cosine and a BM25 score have no common scale, and the fusion
needs no weight to learn. Where the two disagree RRF favours a tool both rank well, which is why it tends to
beat the better of its inputs on a dataset where one does not know which is better in advance
(results/baselines/README.md measures it on BFCL, tau2 and API-Bank).
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
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorers.bm25 import BM25Scorer

RRF_K = 60


def rrf(*scores: np.ndarray, k: int = RRF_K) -> np.ndarray:
    """Reciprocal rank fusion of rankings given by their scores, each ``[B, N]`` (higher first, ties by
    registry position): ``[B, N]`` float32, ``sum_i 1 / (k + rank_i)`` accumulated in float64."""
    b, n = scores[0].shape
    out = np.zeros((b, n), dtype=np.float64)
    share = 1.0 / (k + np.arange(1, n + 1, dtype=np.float64))                            # [N] by rank
    rows = np.arange(b)[:, None]                                                          # [B, 1]
    for s in scores:
        order = np.argsort(-np.asarray(s, dtype=np.float64), axis=1, kind="stable")      # [B, N]
        out[rows, order] += share  # each row's order is a permutation: no index repeats
    return out.astype(np.float32)


class HybridScorer(ScorerBase):
    """Vector search and BM25 fused by reciprocal rank (module docstring); values in
    ``tracer/configs/scorer/hybrid.yaml``.

    Args:
        name: registry name.
        context: rendering of the query, embedded for the vector input and read as words for BM25.
        k1, b: BM25's parameters.
        rrf_k: the fusion's rank offset.
    """

    def __init__(self, *, name: str, context: Mapping, k1: float, b: float, rrf_k: int):
        self.name, self.rrf_k = name, int(rrf_k)
        self.rendering = ContextRendering.from_config(context)
        self.lexical = BM25Scorer(name="bm25", context=context, k1=k1, b=b)
        self.res: Resources | None = None

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        """Index the registry's tool texts for BM25; nothing is learned from the trajectories."""
        self.lexical.fit(trajectories, res)
        self.res = res
        return FitReport(self.name, len(trajectories), 0, 0.0)

    def score_embedded(self, steps: Sequence[Step], ctx: torch.Tensor) -> Scores:
        """``ctx [B, d]``: the steps' contexts under :attr:`rendering`."""
        self._check_fitted()
        b, n = len(steps), len(self.res.registry)
        vec = fallback_scores(self.res, ctx).numpy()                                      # [B, N]
        fused = rrf(vec, self.lexical.step_scores(steps), k=self.rrf_k)                        # [B, N]
        return Scores(primary=no_proposal(b, n), fallback=torch.from_numpy(fused),
                      fell_back=torch.ones(b, dtype=torch.bool))

    def describe(self) -> dict:
        return {"scorer": self.name,
                "ranking": f"reciprocal rank fusion (k={self.rrf_k}) of vector search and BM25",
                "k1": self.lexical.k1, "b": self.lexical.b, "context": asdict(self.rendering)}
