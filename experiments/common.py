"""What the studies share: the inner validation split of an outer fold's training trajectories (chosen without
reading any held-out fold), ranking metrics over a registry's tool texts, the tool-text variants, and writing
a study's JSON. Studies import it as ``experiments.common`` (run them from the repository root with ``python
-m``).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from tracer.build import build_dataset
from tracer.core.folds import kfold
from tracer.core.tool_text import tool_text
from tracer.learn.encoders import Pairs

# the tool text variants: the search text alone (what every scorer embeds), with the parameters' names, and
# with their descriptions too
TOOL_TEXTS = {
    "search": lambda t: t.search_text,
    "params": lambda t: f"{t.search_text} ({', '.join(t.parameters.get('properties') or {})})",
    "params_desc": lambda t: tool_text(t, "parameters"),
}


def retext(pairs: Pairs, text: dict[str, str]) -> Pairs:
    """The pairs with each positive (a tool's search text) replaced by ``text[positive]``."""
    return Pairs(pairs.anchors, tuple(text[p] for p in pairs.positives), pairs.trajectory_ids)


def split_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments naming the outer fold whose training trajectories are split: evaluate.py's folds."""
    ap.add_argument("--dataset", default="bfcl")
    ap.add_argument("--registry", default="large")
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)


def inner_split(a: argparse.Namespace):
    """The dataset, outer fold ``a.fold``'s training trajectories (evaluate.py's split; its test side is never
    read) and the validation groups set aside among them (:func:`validation_groups`)."""
    ds = build_dataset(a.dataset, a.registry, a.seed)
    train = kfold(ds.trajectories, a.folds, a.seed)[a.fold].train
    return ds, train, validation_groups(train, a.seed)


def validation_groups(train, seed: int) -> set[str]:
    """The inner validation split: 20 % of the training trajectories' groups, seeded (the rest is fitted
    on)."""
    groups = sorted({t.group for t in train})
    return set(random.Random(seed).sample(groups, max(1, len(groups) // 5)))


def ranking_metrics(sims: np.ndarray, golds, tools) -> dict:
    """recall@1/@5 and MRR of each row's gold tool (``golds``, texts among ``tools``) in ``sims``,
    ``[S, N]``."""
    col = {x: i for i, x in enumerate(tools)}
    gold = np.array([col[g] for g in golds])
    rank = (sims > sims[np.arange(len(gold)), gold][:, None]).sum(1) + 1    # [S] 1-based, ties to the gold
    return {"recall@1": round(float((rank <= 1).mean()), 4), "recall@5": round(float((rank <= 5).mean()), 4),
            "mrr": round(float((1 / rank).mean()), 4)}


def write_out(path: Path | None, doc: dict) -> None:
    """A study's JSON at ``path`` (``--out``; None: printed rows only)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
