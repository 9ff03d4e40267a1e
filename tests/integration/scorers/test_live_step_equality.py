"""A live step equals the batched path, exactly: one table over the scorers with a single-step path of their
own and the settings that take its branches.

For each row, fitted on BFCL (40 trajectories of fold 1, with MiniLM's static distillation) and run over 100
held-out steps of fold 0: ``select_one(step, embed([step]), k)`` is the presented set of
``finalize(score_embedded(steps, *contexts), k, pad)`` for k = 1 and 5, and ``rank_one`` (whole, and its first
7) is its ranking. Rows name the scorer, its config overrides and the tool index (``exact``, or ``hnsw``: an
HNSW index retrieving 8 tools, so that trie children outside what it retrieved occur). Every other scorer's
live step is the batched path with a batch of one (``tests/integration/scorers/test_scorer_conformance.py``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tracer.build import build_scorer
from tracer.core.folds import assign_folds
from tracer.core.steps import extract_all
from tracer.data import load_dataset
from tracer.encode.embedders import CachedEmbedder
from tracer.encode.index import ToolIndex
from tracer.encode.static import StaticEmbedder
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources
from tracer.scorers.tracer_plus.features import retrieved_order

HEAD = {"max_epochs": 30, "inner_folds": 3}
LAST_2 = {"kind": "last_n", "n": 2, "cross_turn": True}

# (scorer, config overrides, tool index)
TABLE = [
    ("tracer_fixed", {}, "exact"),
    ("tracer_fixed", {"pad": False}, "exact"),
    ("tracer_fixed", {"key": LAST_2, "tau": 0.05}, "exact"),
    ("tracer_g", {"pad": False}, "exact"),
    ("tracer_fixed", {}, "hnsw"),
    ("tracer_plus", {"head": HEAD}, "exact"),                                        # the default
    ("tracer_plus", {"head": HEAD, "request": None}, "exact"),
    ("tracer_plus", {"head": HEAD, "pad": False}, "exact"),
    ("tracer_plus", {"head": {**HEAD, "members": 3}, "model": "mlp"}, "exact"),
    ("tracer_plus", {"head": HEAD, "zero_shot": {"guard": False, "candidates": True}}, "exact"),
    ("tracer_plus", {"head": HEAD, "zero_shot": {"guard": False, "novel_from": "zero_shot"}}, "exact"),
    ("tracer_plus", {"head": HEAD, "zero_shot": {"guard": False, "novel_from": "bm25"}}, "exact"),
    ("tracer_plus", {"head": HEAD, "zero_shot": {"guard": False}}, "hnsw"),
]


@pytest.fixture(scope="module")
def bfcl_fold(minilm_small):
    """BFCL (registry as loaded), trajectories of fold 1 to fit on and the steps of fold 0, with the static
    distillation of MiniLM (its word pieces cut to 6,000: :func:`builders.minilm_cut`). The equality holds
    for any encoder; a distillation gives MiniLM-like vectors, so rankings with real ties and near-ties,
    where MiniLM itself cost each worker ~350 transformer encodes on a clean clone's cold cache (25-30 s on a
    busy 2-core machine, both workers at once)."""
    ds = load_dataset("bfcl", execute=False)
    fold_of = assign_folds([t.group for t in ds.trajectories], 5, 0)
    # 40 trajectories to fit on and 100 held-out steps
    train = [t for t in ds.trajectories if fold_of[t.group] == 1][:40]
    test = [s for s in extract_all([t for t in ds.trajectories if fold_of[t.group] == 0])
            if s.gold in ds.registry]
    res = Resources.build(ds.registry, CachedEmbedder(StaticEmbedder(minilm_small)), device="cpu", seed=0)
    return res, train, test[:100]


def with_index(res: Resources, index: str) -> Resources:
    if index == "exact":
        return res
    exact = res.tool_index
    ann = ToolIndex(exact.names, torch.from_numpy(exact.vectors), "HNSW32,Flat", ann_k=8, ef_search=16)
    assert not ann.exact
    return replace(res, tool_index=ann)


@pytest.mark.parametrize("name, cfg, index", TABLE, ids=lambda x: x if isinstance(x, str) else None)
def test_a_live_step_presents_and_ranks_as_the_batched_path(bfcl_fold, name, cfg, index):
    res, train, test = bfcl_fold
    scorer = build_scorer(name, **cfg)
    scorer.fit(train, with_index(res, index))
    contexts = scorer.embed(test)
    scores = scorer.score_embedded(test, *contexts)
    ranking = finalize(scores, 1).ranking
    for k in (1, 5):
        presented = finalize(scores, k, scorer.pad).presented
        for i, step in enumerate(test):
            one = tuple(c[i:i + 1] for c in contexts)
            assert scorer.select_one(step, one, k) == presented[i], (k, i)
    for i, step in enumerate(test):
        one = tuple(c[i:i + 1] for c in contexts)
        assert np.array_equal(scorer.rank_one(step, one), ranking[i].numpy()), i
        assert np.array_equal(scorer.rank_one(step, one, top=7), ranking[i, :7].numpy()), i


def test_an_approximate_index_gives_tracer_plus_what_it_retrieved_and_the_trie_children(bfcl_fold):
    """Over an HNSW index retrieving 8 tools a live step never scans the registry: its vector order is what
    the index retrieved, and its candidates are the retrieved top m and the trie's children, some of them not
    retrieved (their features take the clipped rank and cosine)."""
    res, train, test = bfcl_fold
    res = with_index(res, "hnsw")
    scorer = build_scorer("tracer_plus", head=HEAD, zero_shot={"guard": False})
    scorer.fit(train, res)
    contexts = scorer.embed(test)
    scores = scorer.score_embedded(test, *contexts)
    assert (torch.isfinite(scores.fallback).sum(1) == 8).all()  # what the index retrieved, -inf elsewhere
    far = 0
    for i, step in enumerate(test):
        one = tuple(c[i:i + 1] for c in contexts)
        cand, _, vec = scorer.score_step(step, *one)
        order = retrieved_order(vec)
        assert np.array_equal(order, res.tool_index.top_one(one[1][0].numpy())[0])
        far += int((~np.isin(cand.tool, order)).sum())
        assert set(order[:scorer.m].tolist()) <= set(cand.tool.tolist()), i
    assert far > 0
