"""tracer_plus's live path: one step scored, selected and ranked on the CPU in numpy
(:mod:`tracer.scoring.single_step`, :func:`tracer.scorers.tracer_plus.step.candidates_one`), equal to the
batched path (``score_embedded`` then :func:`tracer.scoring.ranking.finalize`) by test."""

from __future__ import annotations

import numpy as np

from tracer.core.types import Step
from tracer.scorers.tracer_plus.step import OneCandidates, candidates_one, retrieved_order
from tracer.scoring.protocol import Contexts
from tracer.scoring.ranking import reserved
from tracer.scoring.single_step import as_numpy, rank_one, vector_scores_one
from tracer.scoring.usage import usage_scores_one


class LiveStep:
    """The single-step methods of :class:`~tracer.scorers.tracer_plus.scorer.TracerPlusScorer`, which holds
    the state they read (``res``, ``index``, ``model``, ``zero``, ``m``, ``pad``)."""

    @property
    def zero_shot_wanted(self) -> bool:
        """Whether scoring needs the zero-shot ranking: it is served, or it fills the novel slots or proposes
        candidates."""
        return self.zero_shot_only or self.zero.novel_needs_fusion or self.zero.candidates

    def score_step(self, step: Step, memory, query=None) -> tuple[OneCandidates, np.ndarray, np.ndarray]:
        """(candidates, scores [C] float32, vector scores [N] float32) of one step: numpy, CPU."""
        self._check_fitted()
        mem = as_numpy(memory)
        q = mem if query is None else as_numpy(query)
        vec, order = vector_scores_one(self.res.tool_index, q)                  # [N], [T] or None
        table = self.usage.table(self) if self.zero_shot_wanted else None
        zvec = vec if table is None else usage_scores_one(vec, q, *table)       # the fusion's vector input
        if self.zero_shot_only:  # ranked by the zero-shot scores alone: no candidates, no model to run
            if self.zero.fuses or table is not None:
                vec = (self.zero.scores([step], zvec[None], self.res, self.query_rendering)[0]
                       if self.zero.fuses else zvec)                                            # [N]
                # over an approximate index only the fused tools are finite: their order, no registry sort
                order = None if order is None else retrieved_order(vec)
            order = np.argsort(-vec, kind="stable") if order is None else order
            f = len(self.feature_names)
            return (OneCandidates(np.zeros(0, np.int64), np.zeros((0, f), np.float32),
                                  np.zeros(len(self.tries), bool), -1, order), np.zeros(0, np.float32), vec)
        zs = (self.zero.scores([step], zvec[None], self.res, self.query_rendering)          # [1, N]
              if self.zero.novel_needs_fusion or self.zero.candidates else None)
        fused = zs[0] if self.zero.candidates else None                                      # [N]
        req = self.request.inputs([step], self.res) if self.request else None
        one = candidates_one(self.index, step, mem, vec, self.m, order, fused, req)
        s = self.model.scores_one(one.feats) if len(one.tool) else np.zeros(0, np.float32)
        novel = None
        if self.zero.novel:  # the last slots' claimants, as batched
            novel = self.zero.reserve(zs if self.zero.novel_needs_fusion else vec[None], self.never_called)
        claimants = req.reserve(novel) if req is not None and self.open_slot_serves else novel
        if claimants is not None:
            one.reserve = claimants[0]
        return one, s, vec

    def select_one(self, step: Step, contexts: Contexts, k: int, pad: bool | None = None) -> tuple[int, ...]:
        """The presented set of one step (``contexts = embed([step])``: memory and query contexts)."""
        return self.select_scored(self.score_step(step, *contexts), k, pad)

    def select_scored(self, scored: tuple[OneCandidates, np.ndarray, np.ndarray], k: int,
                      pad: bool | None = None) -> tuple[int, ...]:
        """:meth:`select_one` from the step's :meth:`score_step` (a cascade's gate reads its scores first), as
        :func:`finalize` would present them. Not :func:`finalize_one`: candidate scores are always finite and
        the vector order is at hand (``one.order``), so a lexsort of the candidates (score desc, vector score
        desc, registry id) followed by that order gives the same set with less work on the per-step hot path
        (``benchmarks/bench_step.py`` times it); tested equal to the batched path."""
        pad = self.pad if pad is None else pad
        one, s, vec = scored
        if not len(one.tool) or self.zero_shot_only:
            # fewer ranked tools than k (an approximate index): the rest by registry position, as batched
            order = one.order if len(one.order) >= k else np.argsort(-vec, kind="stable")
            return reserved(tuple(order[:k].tolist()), one.reserve, k, self.reserve_slots)
        head = one.tool[np.lexsort((one.tool, -vec[one.tool], -s))][:k]
        if len(head) == k or not pad:
            return reserved(tuple(head.tolist()), one.reserve, k, self.reserve_slots)
        rest = one.order[:k + len(head)]
        return reserved(tuple(head.tolist()) + tuple(rest[~np.isin(rest, head)][:k - len(head)].tolist()),
                        one.reserve, k, self.reserve_slots)

    def rank_one(self, step: Step, contexts: Contexts, top: int | None = None) -> np.ndarray:
        """The ranking of one step, registry ids best first (the first ``top`` only when given)."""
        return self.rank_scored(self.score_step(step, *contexts), top)

    def rank_scored(self, scored: tuple[OneCandidates, np.ndarray, np.ndarray],
                    top: int | None = None) -> np.ndarray:
        one, s, vec = scored  # rank_one from the step's score_step
        return rank_one(one.tool, s, vec, len(one.tool) == 0 or self.zero_shot_only, top)
