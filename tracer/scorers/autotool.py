"""AutoTool: tool-usage inertia from the last two calls, blended with context-description similarity.

Jia and Li (2026), *AutoTool: Efficient Tool Selection for Large Language Model Agents*
(AAAI 2026), arXiv:2511.14650. The state is the last two calls; a tool's score blends its
normalised transition count with the similarity of the context to the tool's description at a
constant alpha = 0.5:

    score(t) = alpha * N(S, t) / N(S) + (1 - alpha) * cos(c, e_t)

with S the last two calls (across turns), c the embedded context and e_t the embedded tool name and
description (the FAISS fallback index's vectors, so the cosine is exactly the vector baseline's).

Choices where the paper is silent (also in ``configs/scorer/autotool.yaml``):

- *Which tools get scores*: all of them. The transition term is 0 for a tool never seen after S,
  so the blend ranks the whole registry; the top k are presented and no padding is needed.
- *Unseen states* back off: the last two calls -> the last call -> similarity only. Early steps
  have shorter states: the second call of a conversation has S = (first call,), the first has
  S = () (START). With similarity only the ranking is the vector ranking and the step is marked
  ``fell_back``. ``extra["backoff"]`` holds the length of the state that was used (2, 1, 0 for a
  seen START, -1 for similarity only) and ``in_trie`` is True where the full state was seen.
- *Transition counts* come from successful training trajectories only (``successful_only``).
- AutoTool's parameter graph (filling arguments) is out of scope: we score tool selection only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from tracer.core.context import ContextRendering
from tracer.core.types import Step, Trajectory
from tracer.memory.keys import StateKey
from tracer.memory.transitions import TransitionTable
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.ranking import scatter_primary
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources, fallback_scores, fit_steps


class AutoToolScorer(ScorerBase):
    """Blend of transition frequency (with back-off) and context-tool cosine over the whole registry.

    Args:
        name: registry name.
        alpha: weight of the transition term (the paper's constant 0.5).
        context: rendering of the context whose cosine with each tool is taken.
        successful_only: count transitions on successful trajectories only.
        pad: structural, not in the YAML: every tool is scored, so there is nothing to pad.
    """

    def __init__(self, *, name: str, alpha: float, context: Mapping, successful_only: bool, pad: bool = True):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        self.name, self.alpha, self.successful_only, self.pad = name, alpha, successful_only, pad
        self.rendering = ContextRendering.from_config(context)
        self.res: Resources | None = None
        self.tries: list[TransitionTable] = []   # [last two calls, last call]

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        t0 = time.perf_counter()
        self.res = res
        steps = fit_steps(trajectories, res.registry, self.successful_only)
        gold = res.tool_ids([s.gold for s in steps])
        self.tries = [TransitionTable.build(steps, gold, len(res.registry),
                                            StateKey(kind="last_n", n=n, cross_turn=True))
                      for n in (2, 1)]
        return FitReport(self.name, len(trajectories), len(steps), time.perf_counter() - t0)

    def transition(self, steps: Sequence[Step]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """N(S,t)/N(S) over the registry ``[B, N]`` at the first seen back-off level, that level's
        state length ``[B]`` (-1: none seen) and whether the full state was seen ``[B]``."""
        b, n = len(steps), len(self.res.registry)
        freq = torch.zeros(b, n)
        level = torch.full((b,), -1, dtype=torch.long)
        done = torch.zeros(b, dtype=torch.bool)
        full_seen = None
        for trie in self.tries:
            cb = trie.gather(trie.lookup(steps))
            seen = cb.mask.any(1) & ~done                                       # [B]
            if full_seen is None:
                full_seen = cb.mask.any(1)
            p = scatter_primary(cb.tool, cb.mask, (cb.count / cb.node_count.clamp_min(1)[:, None]).float(), n)
            freq = torch.where(seen[:, None], p.clamp_min(0.0), freq)          # -inf (unseen tool) -> 0
            level = torch.where(seen, cb.depth, level)
            done |= seen
        return freq, level, full_seen

    def score_embedded(self, steps: Sequence[Step], ctx: torch.Tensor) -> Scores:
        """``ctx [B, d]``: the steps' contexts under :attr:`rendering`."""
        if not self.tries or self.res is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted")
        cos = fallback_scores(self.res, ctx)                                    # [B, N]
        freq, level, full_seen = self.transition(steps)                         # [B, N], [B], [B]
        blend = self.alpha * freq + (1.0 - self.alpha) * cos                    # [B, N]
        return Scores(primary=blend, fallback=cos, fell_back=level < 0,
                      diagnostics={"in_trie": full_seen, "depth": level, "backoff": level})

    def memory_tables(self) -> list:
        return list(self.tries)

    def describe(self) -> dict:
        return {"scorer": self.name, "paper": "AutoTool (Jia and Li 2026, arXiv:2511.14650)",
                "alpha": self.alpha, "state": "last two calls across turns",
                "backoff": "last two -> last one -> similarity only",
                "scored": "whole registry", "successful_only": self.successful_only}
