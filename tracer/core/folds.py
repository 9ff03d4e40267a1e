"""K-fold splits by group, seeded and stable, with inner folds inside each training split.

A group (the underlying task) never straddles folds. Assignment depends only on the sorted set of
group names, ``k`` and ``seed``, so every scorer evaluated with the same seed sees the same folds
(paired comparisons).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from tracer.core.steps import iter_calls
from tracer.core.types import Trajectory

T = TypeVar("T")


def assign_folds(groups: Sequence[str], k: int, seed: int = 0) -> dict[str, int]:
    """Map each distinct group to a fold in [0, k): a seeded shuffle of the sorted groups, dealt
    round-robin."""
    uniq = sorted(set(groups))
    if k < 2:
        raise ValueError(f"k-fold needs k >= 2, got {k}")
    if len(uniq) < k:
        raise ValueError(f"cannot split {len(uniq)} groups into {k} folds")
    rng = random.Random(seed)
    rng.shuffle(uniq)
    return {g: i % k for i, g in enumerate(uniq)}


def check_folds(k: int, items: Sequence, group=lambda x: x.group, name: str = "folds") -> None:
    """Refuse ``k`` outer folds over ``items`` before any work, naming the override: a group (task) never
    straddles folds, so there can be no more folds than groups."""
    n = len({group(x) for x in items})
    if k > n:
        raise ValueError(f"{name}={k} (override {name}=...): the dataset has {n} groups (tasks), "
                         f"and a group never straddles folds; use at most {n}")


@dataclass(frozen=True)
class Split:
    fold: int
    train: tuple
    test: tuple


def kfold(items: Sequence[T], k: int, seed: int = 0, group=lambda x: x.group) -> list[Split]:
    """Split records (anything with a group) into k (train, test) splits by group."""
    fold_of = assign_folds([group(x) for x in items], k, seed)
    return [
        Split(
            f,
            tuple(x for x in items if fold_of[group(x)] != f),
            tuple(x for x in items if fold_of[group(x)] == f),
        )
        for f in range(k)
    ]


def inner_seed(seed: int, fold: int) -> int:
    """A seed for the inner folds of outer fold ``fold``, stable across processes (no hash randomisation)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{fold}".encode()).digest()[:4], "little")


def row_folds(groups: Sequence[str], k: int, seed: int = 0) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Folds over rows labelled by group (``k`` capped at the number of groups): per fold
    ``(fold, seen rows, held-out rows)``, LongTensors of row indices. The inner folds of the blend
    head and of tracer_plus: every held-out row is scored by an index built from the seen rows only."""
    fold_of = assign_folds(groups, min(k, len(set(groups))), seed)
    fold = torch.tensor([fold_of[g] for g in groups])                                     # [S]
    return [(f, (fold != f).nonzero().squeeze(1), (fold == f).nonzero().squeeze(1))
            for f in sorted(set(fold_of.values()))]


def arrival_order(trajectories: Sequence[T], seed: int, fold: int) -> list[T]:
    """Outer fold ``fold``'s training trajectories in the learning curves' seeded order: ``evaluate.py
    train_trajectories=N`` fits on the first N of it."""
    order = list(trajectories)
    random.Random(seed * 1000 + fold).shuffle(order)
    return order


def tool_folds(trajectories: Sequence[Trajectory], k: int, seed: int = 0) -> dict[str, int]:
    """Every tool some trajectory calls, assigned to one of ``k`` folds as groups are (seeded, stable): the
    held-out-tools split (``evaluate.py holdout_tools=true``) drops from fold f's training every trajectory
    that calls one of fold f's tools, so their steps are tools never seen called."""
    called = {name for t in trajectories for *_, name, _ in iter_calls(t.messages)}
    return assign_folds(sorted(called), k, seed)


def without_tools(trajectories: Sequence[Trajectory], tools: set[str]) -> list[Trajectory]:
    """The trajectories that call none of ``tools``."""
    return [t for t in trajectories if not any(name in tools for *_, name, _ in iter_calls(t.messages))]
