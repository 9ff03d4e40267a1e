"""Vector search and the full registry (LLM-only).

``vector``: the whole registry ranked by cosine of the embedded context with each embedded tool
name and description (the FAISS fallback index); the top k are presented.
``llm_only``: the whole registry is presented at every step: the cost ceiling and the coverage
ceiling. Its ranking (used for recall at k only) is the same vector ranking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict

import torch

from tracer.core.context import ContextRendering
from tracer.core.types import Step, Trajectory
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.ranking import no_proposal
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources, fallback_scores


class VectorScorer(ScorerBase):
    """The registry ranked by cosine of the context with each tool (``vector``); ``present_all``: the whole
    registry presented (``llm_only``). Values: ``tracer/configs/scorer/{vector,llm_only}.yaml``.

    Args:
        name: registry name.
        context: rendering of the query.
        present_all: present every tool (the ranking still orders them, for recall at k).
        pad: structural, not in the YAMLs: the ranking covers the registry, so there is never anything to pad.
    """

    def __init__(self, *, name: str, context: Mapping, present_all: bool, pad: bool = True):
        self.name, self.present_all, self.pad = name, present_all, pad
        self.rendering = ContextRendering.from_config(context)
        self.res: Resources | None = None

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        self.res = res  # nothing learned from the trajectories: the ranking is the vector index's
        return FitReport(self.name, len(trajectories), 0, 0.0)

    def score_embedded(self, steps: Sequence[Step], ctx: torch.Tensor) -> Scores:
        """``ctx [B, d]``: the steps' contexts under :attr:`rendering`."""
        b = len(steps)
        return Scores(primary=no_proposal(b, len(self.res.registry)), fallback=fallback_scores(self.res, ctx),
                      fell_back=torch.ones(b, dtype=torch.bool), present_all=self.present_all)

    def describe(self) -> dict:
        return {"scorer": self.name, "presented": "whole registry" if self.present_all else "top k by cosine",
                "ranking": "cosine of the context with tool name + description (FAISS)",
                "context": asdict(self.rendering)}
