"""The tracer family's live step: :class:`tracer.scorers.tracer.TracerScorer`'s single-step path, one step
scored with :mod:`tracer.scorer_base.single_step` (numpy, fixed blend), the same numbers and presented sets as
the batched path.

Why a path of its own: the batched path with a batch of one costs about the whole per-step budget (under 1
ms beyond the context embedding). ``OMP_NUM_THREADS=1 python -m benchmarks.bench_step --scorers
tracer_fixed`` (BFCL, registry large, fitted on folds 1-4, the 879 steps of fold 0, k = 5, thread CPU time,
best of 3; 2-core x86 CPU, load average 4-6 from other jobs, 2026-12-07, two runs): batch of one 930 and
1,147 µs p50 (1,062 and 1,732 p95), this path 111 and 108 µs p50 (136 and 132 p95), the same presented set
on 879 of 879 steps.

Built from :mod:`tracer.scorer_base.single_step`'s primitives (each names the batched function it equals) and
the rule every presented set follows (:func:`tracer.scorer_base.ranking.present`, which ``finalize`` applies
to each row); ``tests/integration/scorers/test_live_step_equality.py`` holds it equal to the batched path,
setting by setting.

TracerScorer derives from :class:`TracerSingleStep` ahead of :class:`tracer.scorer_base.protocol.ScorerBase`,
whose batched ``select_one`` / ``rank_one`` (a batch of one) serve the learned blend through ``super()``.
The methods read the scorer's ``trie``, ``res``, ``key``, ``blend``, ``tau``, ``pad`` and ``global_set``.
"""

from __future__ import annotations

import numpy as np

from tracer.core.types import Step
from tracer.scorer_base.protocol import Contexts
from tracer.scorer_base.ranking import present
from tracer.scorer_base.single_step import (
    OneStep,
    as_numpy,
    children_one,
    confidence_one,
    dense_scores_one,
    finalize_one,
    rank_one,
    top_scores_one,
)


class TracerSingleStep:
    """TracerScorer's ``score_one``, ``select_one`` and ``rank_one`` (see the module docstring)."""

    def score_one(self, step: Step | tuple[str, ...], context, with_fallback: bool = True
                  ) -> tuple[OneStep, np.ndarray, np.ndarray | None, bool, float]:
        """One step (or a state tuple) and its context embedding ``[d]``: (children, blended child
        scores ``[C]`` float32, fallback ``[N]`` float32 (None unless ``with_fallback``), fell_back,
        kappa). Fixed blend only; the same numbers as :meth:`score_embedded`."""
        self._check_fitted()
        if self.blend != "fixed":
            raise NotImplementedError("the single-step path covers the fixed blend; use score_embedded")
        state = step if isinstance(step, tuple) else self.key.state(step)
        c = np.asarray(as_numpy(context), dtype=np.float64)
        ch = children_one(self.trie, state, c)
        s = ch.log_p + ch.log_l                                                 # [C] float32
        kappa = confidence_one(s)
        fallback = dense_scores_one(self.res.tool_index, c) if with_fallback else None  # [N]
        return ch, s, fallback, bool(len(s) == 0 or kappa < self.tau), kappa

    def select_one(self, step: Step | tuple[str, ...], contexts: Contexts, k: int, pad: bool | None = None
                   ) -> tuple[int, ...]:
        """The presented set of one step (``contexts``: :meth:`embed` of it), exactly as :func:`finalize`
        presents it.

        The fallback scores are computed only when they can change the answer: when the step falls back, when
        children are too few to fill k with padding, or when child scores tie within the top k (ties are
        broken by the fallback)."""
        pad = self.pad if pad is None else pad
        if self.blend != "fixed":
            return super().select_one(self._as_step(step), contexts, k, pad)
        context = contexts[0]
        ch, s, _, fell_back, _ = self.score_one(step, context, with_fallback=False)
        n_child = len(s)
        if not fell_back and k > 0 and (n_child >= k or not pad):
            m = min(k, n_child)
            order = np.argsort(-s, kind="stable")
            top = s[order[: m + 1]]                                             # the top m and the next one
            if np.isfinite(top).all() and (top[1:] < top[:-1]).all():            # no ties: order is final
                return present(ch.tool[order[:m]].tolist(), k, pad, False, n_child, self.global_set)
        c = np.asarray(as_numpy(context), dtype=np.float64)
        fallback = top_scores_one(self.res.tool_index, c, k + n_child, ch.tool)  # exact where it matters
        return finalize_one(ch.tool, s, fallback, fell_back, k, pad, self.global_set)

    def rank_one(self, step: Step | tuple[str, ...], contexts: Contexts, top: int | None = None
                 ) -> np.ndarray:
        """The ranking of one step, registry ids best first (the first ``top`` only when given)."""
        if self.blend != "fixed":
            return super().rank_one(self._as_step(step), contexts, top)
        context = contexts[0]
        ch, s, fallback, fell_back, _ = self.score_one(step, context, with_fallback=top is None)
        if top is not None:
            c = np.asarray(as_numpy(context), dtype=np.float64)
            fallback = top_scores_one(self.res.tool_index, c, top + len(s), ch.tool)
        return rank_one(ch.tool, s, fallback, fell_back, top)

    def _as_step(self, step: Step | tuple[str, ...]) -> Step:
        if not isinstance(step, tuple):
            return step
        if self.key.cross_turn or self.key.kind != "prefix":
            raise ValueError("pass a Step (not a state tuple) to the learned blend with this state key")
        return Step("", "", 0, len(step), step, step, "", ())
