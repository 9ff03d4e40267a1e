"""tracer_plus's live step: one step scored, selected and ranked on the CPU in numpy, beside the batched path
(``score_embedded`` then :func:`tracer.scorer_base.ranking.finalize`) and built from the same primitives.

Why a path of its own: the batched path with a batch of one misses the per-step budget (under 1 ms beyond the
context embedding). ``OMP_NUM_THREADS=1 python -m benchmarks.bench_step --scorers tracer_plus --request``
(BFCL, registry large, fitted on folds 1-4, the 879 steps of fold 0, k = 5, thread CPU time, best of 3; 2-core
x86 CPU, load average 4-6 from other jobs, 2026-12-07, two runs; the same presented set on 879 of 879 steps):

=============================== ============================== ===========================
tracer_plus                     batch of one: p50 / p95 (µs)   live step: p50 / p95 (µs)
=============================== ============================== ===========================
the default (request evidence)  1,544 / 1,736; 1,874 / 2,675   668 / 807; 655 / 859
``request: null``               1,247 / 1,462; 1,397 / 2,159   380 / 426; 398 / 497
=============================== ============================== ===========================

Before the batch built its candidates from the one-step rows (torch over the batch instead), the same runs
timed its batch of one at 5,069 and 5,410 µs p50 and this path at 653 and 606 µs.

What the two paths share, so that they cannot drift: a step's candidates and feature rows
(:func:`tracer.scorers.tracer_plus.features.candidates_one`, which the batched
:func:`~tracer.scorers.tracer_plus.features.candidates` stacks row by row), the candidate model's scores
(:meth:`CandidateModel.scores_one`, which its batched ``scores`` runs over blocks of rows), the usage vectors'
scores (:func:`tracer.scorer_base.usage.usage_scores_one`), the zero-shot fusion (``ZeroShot.scores`` on a
batch of one), the request evidence, the reserved slots' claimants and the presentation rule
(:func:`tracer.scorer_base.ranking.present`). What the live step does its own way: the vector scores of one
query (:func:`tracer.scorer_base.single_step.vector_scores_one`, no torch) and the first k of the ranking,
read from a lexsort of the candidates and the vector order at hand instead of a sort of the registry; both are
held equal to the batched path by ``tests/integration/scorers/test_live_step_equality.py``.
"""

from __future__ import annotations

import numpy as np

from tracer.core.types import Step
from tracer.scorer_base.protocol import Contexts
from tracer.scorer_base.ranking import present
from tracer.scorer_base.single_step import as_numpy, rank_one, vector_scores_one
from tracer.scorer_base.usage import usage_scores_one
from tracer.scorers.tracer_plus.features import (
    OneCandidates,
    candidates_one,
    retrieved_order,
)


class LiveStep:
    """The single-step methods of :class:`~tracer.scorers.tracer_plus.scorer.TracerPlusScorer`, which holds
    the state they read (``res``, ``index``, ``model``, ``zero``, ``m``, ``pad``)."""

    @property
    def zero_shot_wanted(self) -> bool:
        """Whether scoring needs the zero-shot ranking: it is served, or it fills the novel slots or proposes
        candidates."""
        return self.zero_shot_only or self.zero.novel_needs_fusion or self.zero.candidates or self.gates

    def score_step(self, step: Step, memory, query=None) -> tuple[OneCandidates, np.ndarray, np.ndarray]:
        """(candidates, scores [C] float32, vector scores [N] float32) of one step: numpy, CPU."""
        self._check_fitted()
        mem = as_numpy(memory)
        q = mem if query is None else as_numpy(query)
        vec, order = vector_scores_one(self.res.tool_index, q)                  # [N], [T] or None
        table = self.usage.table(self) if self.zero_shot_wanted else None
        zvec = vec if table is None else usage_scores_one(vec, q, *table)       # the fusion's vector input
        if self.zero_shot_only:  # ranked by the zero-shot scores alone: no candidates, no model to run
            return self._zero_shot_step(step, vec, zvec, order, table is not None)
        zs = (self.zero.scores([step], zvec[None], self.res, self.query_rendering)          # [1, N]
              if self.zero.novel_needs_fusion or self.zero.candidates else None)
        fused = zs[0] if self.zero.candidates else None                                      # [N]
        req = self.request.inputs([step], self.res) if self.request else None
        one = candidates_one(self.index, step, mem, vec, self.m, order, fused, req)
        if self.gates and not one.in_state[0]:  # a state the logs never reached: the fusion, as batched
            return self._zero_shot_step(step, vec, zvec, order, table is not None)
        s = self.model.scores_one(one.feats) if len(one.tool) else np.zeros(0, np.float32)
        novel = None
        if self.zero.novel:  # the last slots' claimants, as batched
            source = self.zero.novel_scores([step], vec[None], zs, self.res, self.query_rendering,
                                            None if req is None else req.bm25)                  # [1, N]
            novel = self.zero.reserve(source, self.never_called, [step], self.res.registry)
        claimants = req.reserve(novel) if req is not None and self.open_slot_serves else novel
        if claimants is not None:
            one.reserve = claimants[0]
        return one, s, vec

    def _zero_shot_step(self, step: Step, vec: np.ndarray, zvec: np.ndarray, order: np.ndarray | None,
                        usage: bool) -> tuple[OneCandidates, np.ndarray, np.ndarray]:
        """:meth:`score_step` of a step ranked by the zero-shot scores alone (no candidates): from its vector
        scores ``vec [N]``, the fusion's vector input ``zvec [N]`` and the approximate index's ``order``."""
        if self.zero.fuses or usage:
            vec = (self.zero.scores([step], zvec[None], self.res, self.query_rendering)[0]
                   if self.zero.fuses else zvec)                                                # [N]
            # over an approximate index only the fused tools are finite: their order, no registry sort
            order = None if order is None else retrieved_order(vec)
        order = np.argsort(-vec, kind="stable") if order is None else order
        f = len(self.feature_names)
        return (OneCandidates(np.zeros(0, np.int64), np.zeros((0, f), np.float32),
                              np.zeros(len(self.tries), bool), -1, order), np.zeros(0, np.float32), vec)

    def select_one(self, step: Step, contexts: Contexts, k: int, pad: bool | None = None) -> tuple[int, ...]:
        """The presented set of one step (``contexts = embed([step])``: memory and query contexts)."""
        return self.select_scored(self.score_step(step, *contexts), k, pad)

    def select_scored(self, scored: tuple[OneCandidates, np.ndarray, np.ndarray], k: int,
                      pad: bool | None = None) -> tuple[int, ...]:
        """:meth:`select_one` from the step's :meth:`score_step` (a cascade's gate reads its scores first), as
        :func:`finalize` would present them: the first k of the ranking, then :func:`present`. Not
        :func:`rank_one`'s sort of the registry: candidate scores are always finite and the vector order is at
        hand (``one.order``), so a lexsort of the candidates (score desc, vector score desc, registry id)
        followed by that order gives the same first k with less work on the per-step hot path."""
        pad = self.pad if pad is None else pad
        one, s, vec = scored
        fell_back = not len(one.tool) or self.zero_shot_only
        if fell_back:  # fewer ranked tools than k (an approximate index): the rest by registry position
            top = one.order if len(one.order) >= k else np.argsort(-vec, kind="stable")
        else:
            top = one.tool[np.lexsort((one.tool, -vec[one.tool], -s))][:k]
            if len(top) < k and pad:
                rest = one.order[:k + len(top)]
                top = np.concatenate([top, rest[~np.isin(rest, top)]])
        return present(top[:k].tolist(), k, pad, fell_back, len(one.tool), (), one.reserve,
                       self.reserve_slots)

    def rank_one(self, step: Step, contexts: Contexts, top: int | None = None) -> np.ndarray:
        """The ranking of one step, registry ids best first (the first ``top`` only when given)."""
        return self.rank_scored(self.score_step(step, *contexts), top)

    def rank_scored(self, scored: tuple[OneCandidates, np.ndarray, np.ndarray],
                    top: int | None = None) -> np.ndarray:
        one, s, vec = scored  # rank_one from the step's score_step
        return rank_one(one.tool, s, vec, len(one.tool) == 0 or self.zero_shot_only, top)
