"""Training pairs for the encoder trainers (:mod:`tracer.learn.encoder`, :mod:`tracer.learn.static_encoder`):
(rendered context, gold tool text) per decision step, the trie's hard negatives, and batches without
false negatives.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tracer.core.context import ContextRendering
from tracer.core.types import Registry, Step, Trajectory
from tracer.memory.keys import PREFIX, StateKey
from tracer.scoring.resources import training_steps


@dataclass(frozen=True)
class Pairs:
    """Training pairs, with the trajectory each came from (so a leak can be checked), and optionally
    one hard negative tool text per pair (:func:`trie_negatives`)."""

    anchors: tuple[str, ...]
    positives: tuple[str, ...]
    trajectory_ids: tuple[str, ...]
    negatives: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.negatives is not None and len(self.negatives) != len(self.anchors):
            raise ValueError(f"Pairs: {len(self.negatives)} negatives for {len(self.anchors)} pairs")

    def __len__(self) -> int:
        return len(self.anchors)

    @classmethod
    def cat(cls, parts: Sequence[Pairs]) -> Pairs:
        """The pairs of several sources in order (e.g. several datasets for a transferred encoder)."""
        with_neg = {p.negatives is not None for p in parts}
        if len(with_neg) > 1:
            raise ValueError("Pairs.cat: some parts have hard negatives and some not")
        fields = ("anchors", "positives", "trajectory_ids") + (("negatives",) if with_neg == {True} else ())
        return cls(*(tuple(x for p in parts for x in getattr(p, f)) for f in fields))

    def digest(self) -> str:
        h = hashlib.sha256()
        for a, p in zip(self.anchors, self.positives):
            h.update(a.encode() + b"\0" + p.encode() + b"\1")
        if self.negatives is not None:  # only then: the keys of in-batch checkpoints stay as they were
            for n in self.negatives:
                h.update(b"\2" + n.encode())
        return h.hexdigest()


def texts_digest(texts: Sequence[str]) -> str:
    """A content hash of a list of texts, in order (the candidate tools a checkpoint was ranked against)."""
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()


def training_pairs(trajectories: Sequence[Trajectory], registry: Registry, rendering: ContextRendering,
                   successful_only: bool = True, negatives: str = "in_batch", seed: int = 0) -> Pairs:
    """(rendered context, gold tool text) for every step of the (successful) trajectories whose gold is in
    the registry; with ``negatives="trie"`` also one hard negative per pair (:func:`trie_negatives`)."""
    if negatives not in ("in_batch", "trie"):
        raise ValueError(f"training_pairs: negatives must be in_batch or trie, got {negatives!r}")
    steps = training_steps(trajectories, registry, successful_only)
    hard = None
    if negatives == "trie":
        hard = tuple(registry.get(n).search_text for n in trie_negatives(steps, registry, seed))
    return Pairs(tuple(rendering.render(s.context) for s in steps),
                 tuple(registry.get(s.gold).search_text for s in steps),
                 tuple(s.trajectory_id for s in steps), hard)


def trie_negatives(steps: Sequence[Step], registry: Registry, seed: int = 0, key: StateKey = PREFIX) -> list[str]:
    """One hard negative tool per step: another child of the step's trie state (a tool that followed the same
    calls in some training step, not this step's gold), drawn seeded; a random registry tool when the
    state has no other child. These are the tools tracer_plus's vector features must tell apart from the
    gold where the trie itself cannot: the other branches out of the same node.
    """
    names = [t.name for t in registry]
    if len(names) < 2:
        raise ValueError(f"trie negatives need a registry of at least 2 tools, got {len(names)}")
    children = trie_children(steps, key)
    rng = random.Random(seed)
    out = []
    for s in steps:
        other = sorted(children[key.state(s)] - {s.gold})
        pick = rng.choice(other or names)
        while pick == s.gold:  # only from the registry fallback, which holds the gold
            pick = rng.choice(names)
        out.append(pick)
    return out


def trie_children(steps: Sequence[Step], key: StateKey = PREFIX) -> dict[tuple[str, ...], set[str]]:
    """State -> the tools that followed it in ``steps`` (the trie's children, without counts)."""
    children: dict[tuple[str, ...], set[str]] = {}
    for s in steps:
        children.setdefault(key.state(s), set()).add(s.gold)
    return children


def context_partners(pairs: Pairs, seed: int) -> list[int | None]:
    """For each pair, another pair with the same positive tool and a different anchor text (seeded choice), or
    None where the tool has no second context."""
    by_tool: dict[str, list[int]] = {}
    for i, p in enumerate(pairs.positives):
        by_tool.setdefault(p, []).append(i)
    rng = random.Random(seed)
    return [rng.choice(others) if (others := [j for j in by_tool[p] if pairs.anchors[j] != pairs.anchors[i]]) else None
            for i, p in enumerate(pairs.positives)]


def no_duplicate_batches(pairs: Pairs, batch_size: int, seed: int) -> list[list[int]]:
    """Pair indices in batches with no anchor or positive text twice, in a seeded random order.

    Greedy, as sentence-transformers' NoDuplicatesBatchSampler: each batch takes the next pairs in
    the shuffled order that clash with nothing already in it; the rest wait for a later batch.
    With hard negatives, no pair's negative is another pair's positive in the batch either (it would
    be a false negative for that pair's anchor). Batches of one pair (no negative, so no gradient) are dropped.
    """
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    negs = pairs.negatives
    batches = []
    while order:
        batch, anchors, positives, negatives, rest = [], set(), set(), set(), []
        for i in order:
            a, p, n = pairs.anchors[i], pairs.positives[i], negs[i] if negs is not None else None
            # a tool text that is a positive here and a negative there clashes both ways
            clash = a in anchors or p in positives or p in negatives or n in positives
            if len(batch) < batch_size and not clash:
                batch.append(i)
                anchors.add(a)
                positives.add(p)
                if n is not None:
                    negatives.add(n)
            else:
                rest.append(i)
        batches.append(batch)
        order = rest
    return [b for b in batches if len(b) > 1]
