"""ToolNet: tools as nodes of a weighted directed graph; only the successors of the last tool are shown.

Liu et al. (2024), *ToolNet: Connecting Large Language Models with Massive Tools via Tool Graph*,
arXiv:2403.00839. Tools are nodes; a transition a->b seen in the training trajectories is a
directed edge whose weight is how often it occurs. At a step the model is shown the successors of
the previously invoked tool, ranked by weight:

    w(a, b) = N(a, b) / N(a)          N(a, b): times b was called right after a; N(a) = sum_b N(a, b)

(normalising by N(a) does not change the order; it puts the weights on a common 0..1 scale.)

Choices where the paper is silent (also in ``configs/scorer/toolnet.yaml``):

- *Previous tool*: the previous call across turns (``Step.history``), so the first call of a
  later turn follows the last call of the turn before. The first call of a conversation (empty
  history) starts from a START node whose successors are the tools that opened training
  conversations.
- *Edge weights*: counted on successful training trajectories only (``successful_only``); ToolNet
  also re-weights edges online from tool evaluations, which a static log does not give us.
- *No successors* (the last tool never had a successor in training): the step falls back to the
  vector ranking of the whole registry (``fell_back = True``, ``in_trie = False``).
- *Padding*: when the last tool has fewer than k successors the rest of the k is filled from the
  vector ranking (``pad: true``, as Tracer does) so that recall at k is comparable across
  scorers; ``pad: false`` shows the successors only.
- *Ties* between successors of equal weight are broken by the vector ranking, then registry order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from tracer.core.context import ContextRendering
from tracer.core.types import Step, Trajectory
from tracer.memory.keys import LAST_CALL
from tracer.memory.transitions import TransitionTable
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.ranking import scatter_primary
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources, fallback_scores, fit_steps


class ToolNetScorer(ScorerBase):
    """Successors of the previous tool ranked by transition weight; vector ranking otherwise.

    Args:
        name: registry name.
        context: rendering of the fallback query (vector search over the registry).
        pad: fill up to k from the vector ranking when there are fewer than k successors.
        successful_only: count transitions on successful trajectories only.
    """

    def __init__(self, *, name: str, context: Mapping, pad: bool, successful_only: bool):
        self.name, self.pad, self.successful_only = name, pad, successful_only
        self.rendering = ContextRendering.from_config(context)
        self.res: Resources | None = None
        self.trie: TransitionTable | None = None

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        t0 = time.perf_counter()
        self.res = res
        steps = fit_steps(trajectories, res.registry, self.successful_only)
        self.trie = TransitionTable.build(steps, res.tool_ids([s.gold for s in steps]), len(res.registry),
                                          LAST_CALL)
        return FitReport(self.name, len(trajectories), len(steps), time.perf_counter() - t0)

    def successors(self, previous: str | None) -> dict[str, float]:
        """{tool: w(previous, tool)} for a previous tool name (None = START)."""
        state = () if previous is None else (previous,)
        children = self.trie.children(state)
        total = sum(children.values())
        return {self.res.registry[t].name: c / total for t, c in children.items()}

    def score_embedded(self, steps: Sequence[Step], ctx: torch.Tensor) -> Scores:
        """``ctx [B, d]``: the steps' contexts under :attr:`rendering` (the fallback query)."""
        if self.trie is None or self.res is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted")
        cb = self.trie.gather(self.trie.lookup(steps))
        weight = cb.count / cb.node_count.clamp_min(1)[:, None]                 # [B, C]
        has_children = cb.mask.any(1)                                           # [B]
        return Scores(
            primary=scatter_primary(cb.tool, cb.mask, weight.float(), len(self.res.registry)),
            fallback=fallback_scores(self.res, ctx),
            fell_back=~has_children,
            diagnostics={"in_trie": has_children, "depth": cb.depth, "n_children": cb.n_children},
        )

    def memory_tables(self) -> list[TransitionTable]:
        return [self.trie] if self.trie is not None else []

    def describe(self) -> dict:
        return {"scorer": self.name, "paper": "ToolNet (Liu et al. 2024, arXiv:2403.00839)",
                "state": "previous call across turns (START for the first call)",
                "no_successors": "vector ranking (fell_back)", "pad": self.pad,
                "successful_only": self.successful_only,
                "n_nodes": self.trie.n_nodes if self.trie else 0,
                "n_edges": self.trie.n_edges if self.trie else 0}
