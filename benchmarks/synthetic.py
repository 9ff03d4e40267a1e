"""The seeded synthetic corpus of ``bench_scale`` and ``bench_update``: a skewed Markov chain over a registry
of ``n`` tools, its trajectories' prefix states, and random unit vectors that stand in for embeddings.

The chain: a turn's first tool is drawn from a Zipf law (exponent 1.1) over the registry; each next tool
follows one of ``FANOUT`` successors per tool (drawn from the same law, chosen with probability proportional
to 1/rank^1.5); a turn stops after each call with probability ``STOP`` (at most ``MAX_LEN`` calls).
"""

from __future__ import annotations

import numpy as np
import torch

FANOUT, STOP, MAX_LEN = 8, 0.35, 6


class Chain:
    """The seeded skewed Markov chain over ``n_tools`` tools."""

    def __init__(self, n_tools: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.n_tools = n_tools
        w = 1.0 / np.arange(1, n_tools + 1) ** 1.1
        self.start_cdf = np.cumsum(w / w.sum())
        self.popular = rng.permutation(n_tools)  # tool id of each popularity rank
        self.succ = self.popular[np.searchsorted(self.start_cdf, rng.random((n_tools, FANOUT)), side="right")
                                 .clip(max=n_tools - 1)]                                      # [n_tools, 8]
        sw = 1.0 / np.arange(1, FANOUT + 1) ** 1.5
        self.succ_cdf = np.cumsum(sw / sw.sum())

    def turns(self, n_traj: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Tool ids of every turn of ``n_traj`` trajectories: ``[T, MAX_LEN]`` (-1 padded) and lengths
        ``[T]``."""
        n_turns = 1 + rng.binomial(2, 0.4, n_traj)
        t = int(n_turns.sum())
        seq = np.full((t, MAX_LEN), -1, dtype=np.int64)
        first = np.searchsorted(self.start_cdf, rng.random(t), side="right").clip(max=self.n_tools - 1)
        seq[:, 0] = self.popular[first]
        alive = np.ones(t, dtype=bool)
        for i in range(1, MAX_LEN):
            alive &= rng.random(t) >= STOP
            j = np.searchsorted(self.succ_cdf, rng.random(t), side="right").clip(max=FANOUT - 1)
            nxt = self.succ[seq[:, i - 1].clip(min=0), j]
            seq[:, i] = np.where(alive, nxt, -1)
        return seq, (seq >= 0).sum(1)


def step_states(seq: np.ndarray, lengths: np.ndarray,
                names: list[str]) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """The prefix state and the gold tool of every step of every turn."""
    states, gold = [], []
    for row, n in zip(seq.tolist(), lengths.tolist()):
        state: tuple[str, ...] = ()
        for i in range(n):
            states.append(state)
            gold.append(row[i])
            state = state + (names[row[i]],)
    return states, np.asarray(gold, dtype=np.int64)


def unit_rows(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)  # [n, d]
