"""One out-of-fold builder for every learned model: no training step is scored by an index that saw
its own trajectory.

The training steps are split into inner folds by group (:func:`tracer.core.folds.row_folds`,
seeded, so all trials of one task land in one fold); for each fold an index is built from the
other folds' steps and the fold's own steps are scored against it. The blend head scores the
children of one trie, tracer_plus the candidates of one trie per key; both go through here.

Example::

    parts = out_of_fold([s.group for s in steps], 5, seed,
                        build=lambda seen, fold: ExecutionTrie.build(...rows seen...),
                        score=lambda trie, held, fold: score_steps(trie, ...rows held..., fold))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F

from tracer.core.folds import row_folds

Index = TypeVar("Index")
Part = TypeVar("Part")


def out_of_fold(groups: Sequence[str], inner_folds: int, seed: int,
                build: Callable[[torch.Tensor, int], Index],
                score: Callable[[Index, torch.Tensor, int], Part]) -> list[Part]:
    """For each inner fold f (by ``groups``, row-aligned with the steps): ``score(build(seen, f), held, f)``,
    where ``seen`` and ``held`` are the row indices ``[n]`` outside and inside fold f."""
    return [score(build(seen, f), held, f) for f, seen, held in row_folds(groups, inner_folds, seed)]


def pad_cat(parts: Sequence[torch.Tensor], width: int, value, dim: int = 1) -> torch.Tensor:
    """Concatenate along dim 0, each tensor padded at the end of ``dim`` with ``value`` to ``width``
    (the candidate width C of ``[S, C]`` or ``[S, C, F]`` step tensors)."""
    out = []
    for x in parts:
        pad = [0, 0] * (x.dim() - 1 - dim) + [0, width - x.shape[dim]]
        out.append(F.pad(x, pad, value=value))
    return torch.cat(out)
