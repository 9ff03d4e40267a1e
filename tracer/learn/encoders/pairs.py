"""Training pairs for the encoder trainers (:mod:`tracer.learn.encoders.transformer`,
:mod:`tracer.learn.encoders.static`): (rendered context, gold tool text) per decision step, the context
partners of the context-to-context term, and batches without false negatives.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tracer.core.context import ContextRendering
from tracer.core.tool_text import tool_text as render_tool
from tracer.core.types import Registry, Trajectory
from tracer.scorer_base.resources import training_steps


@dataclass(frozen=True)
class Pairs:
    """Training pairs, with the trajectory each came from (so a leak can be checked)."""

    anchors: tuple[str, ...]
    positives: tuple[str, ...]
    trajectory_ids: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.anchors)

    @classmethod
    def cat(cls, parts: Sequence[Pairs]) -> Pairs:
        """The pairs of several sources in order (e.g. several datasets for a transferred encoder)."""
        return cls(*(tuple(x for p in parts for x in getattr(p, f))
                     for f in ("anchors", "positives", "trajectory_ids")))

    def digest(self) -> str:
        h = hashlib.sha256()
        for a, p in zip(self.anchors, self.positives):
            h.update(a.encode() + b"\0" + p.encode() + b"\1")
        return h.hexdigest()


def training_pairs(trajectories: Sequence[Trajectory], registry: Registry, rendering: ContextRendering,
                   successful_only: bool = True, tool_text: str = "name_description") -> Pairs:
    """(rendered context, gold tool text) for every step of the (successful) trajectories whose gold is in
    the registry; the tool text rendered as ``tool_text`` (:mod:`tracer.core.tool_text`)."""
    steps = training_steps(trajectories, registry, successful_only)
    return Pairs(tuple(rendering.render(s.context) for s in steps),
                 tuple(render_tool(registry.get(s.gold), tool_text) for s in steps),
                 tuple(s.trajectory_id for s in steps))


def context_partners(pairs: Pairs, seed: int) -> list[int | None]:
    """For each pair, another pair with the same positive tool and a different anchor text (seeded choice), or
    None where the tool has no second context."""
    by_tool: dict[str, list[int]] = {}
    for i, p in enumerate(pairs.positives):
        by_tool.setdefault(p, []).append(i)
    rng = random.Random(seed)
    out: list[int | None] = []
    for i, p in enumerate(pairs.positives):
        others = [j for j in by_tool[p] if pairs.anchors[j] != pairs.anchors[i]]
        out.append(rng.choice(others) if others else None)
    return out


def no_duplicate_batches(pairs: Pairs, batch_size: int, seed: int) -> list[list[int]]:
    """Pair indices in batches with no anchor or positive text twice, in a seeded random order.

    Greedy, as sentence-transformers' NoDuplicatesBatchSampler: each batch takes the next pairs in
    the shuffled order that clash with nothing already in it; the rest wait for a later batch.
    Batches of one pair (no negative, so no gradient) are dropped.
    """
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    batches = []
    while order:
        batch, anchors, positives, rest = [], set(), set(), []
        for i in order:
            a, p = pairs.anchors[i], pairs.positives[i]
            if len(batch) < batch_size and a not in anchors and p not in positives:
                batch.append(i)
                anchors.add(a)
                positives.add(p)
            else:
                rest.append(i)
        batches.append(batch)
        order = rest
    return [b for b in batches if len(b) > 1]
