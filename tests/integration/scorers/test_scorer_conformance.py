"""Every registered scorer honours the interface; new scorers are covered by registering them.

For each scorer YAML in ``tracer/configs/scorer/``, built from it and fitted on the tiny corpus
(plus one failed trajectory) with the keyword embedder: the ranking is a permutation of the
registry, the presented set is a subset of it, two fits with the same seed give the same result,
scoring leaves the fitted state untouched, every capability of :class:`tracer.scoring.protocol.Scorer`
is declared, and a live step (``select_one`` / ``rank_one`` on ``embed([step])``) equals the batched
ranking; for the tracer family's single-step path also on BFCL with the real MiniLM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch
from builders import ROOT, KeywordEmbedder, call, result

from tracer.build import build_scorer, load_config, names
from tracer.core.steps import extract_all
from tracer.core.types import Trajectory
from tracer.scoring.fit import FitReport
from tracer.scoring.protocol import Scorer
from tracer.scoring.ranking import finalize
from tracer.scoring.records import Scores
from tracer.scoring.resources import Resources

SKIP_ATTRS = {"res", "executor"}   # shared resources (the embedder's cache grows as it encodes)
SAVEABLE = {"tracer", "tracer_fixed", "tracer_g", "tracer_plus", "cascade"}  # scorers with save/load


def extra_trajectories() -> tuple[list[Trajectory], list[Trajectory]]:
    """(a failed training trajectory, a held-out one whose previous tools never had successors)."""
    failed = Trajectory(id="f0", group="f0", domain="tiny", success=False, reward=0.0, messages=(
        {"role": "user", "content": "Email me the weather"}, call("send_email", 0),
        result(0, "error: no recipient"), call("get_weather", 1), result(1)))
    held_out = Trajectory(id="h0", group="h0", domain="tiny", messages=(
        {"role": "user", "content": "List my files then email them"}, call("list_files", 0), result(0),
        call("send_email", 1), result(1), {"role": "user", "content": "and cancel my flight booking"},
        call("cancel_booking", 2), result(2)))
    return [failed], [held_out]


def build(name: str):
    cfg = load_config("scorer", name)
    for node in (cfg, cfg.get("fast"), cfg.get("slow")):  # a cascade's stages too
        # a trained head: fit it quickly
        if isinstance(node, Mapping) and isinstance(node.get("head"), Mapping):
            node.head.max_epochs, node.head.inner_folds = 20, 3
    return build_scorer(cfg)


# a cascade's slow stage: the same registry under another encoder (fewer keywords: it tells flights from
# bookings by "flight" alone), so the two stages rank differently
SLOW_KEYWORDS = ("flight", "cancel", "weather", "email", "file")


def snapshot(obj: Any, seen: set[int] | None = None, depth: int = 0) -> Any:
    """A deep, comparable copy of a scorer's fitted state (tensors cloned), shared resources left out."""
    seen = set() if seen is None else seen
    if depth > 12:
        return "<deep>"
    if isinstance(obj, torch.Tensor):
        return ("tensor", obj.detach().cpu().clone())
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.copy())
    if isinstance(obj, torch.nn.Module):
        return snapshot(obj.state_dict(), seen, depth + 1)
    if obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return obj
    if isinstance(obj, Mapping):
        return {repr(k): snapshot(v, seen, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [snapshot(v, seen, depth + 1) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(repr(v) for v in obj)
    if callable(obj) and not hasattr(obj, "__dict__"):
        return type(obj).__name__
    if hasattr(obj, "__dict__"):
        if id(obj) in seen:
            return "<cycle>"
        seen.add(id(obj))
        return (type(obj).__name__, {k: snapshot(v, seen, depth + 1) for k, v in vars(obj).items()
                                     if k not in SKIP_ATTRS})
    return type(obj).__name__


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a.nan_to_num(0.123), b.nan_to_num(0.123))))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and np.array_equal(a, b, equal_nan=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def scores_equal(a: Scores, b: Scores) -> bool:
    return same({f.name: getattr(a, f.name) for f in dataclasses.fields(a)},
                {f.name: getattr(b, f.name) for f in dataclasses.fields(b)})


@pytest.fixture
def corpus(tiny_trajs):
    failed, held_out = extra_trajectories()
    train = list(tiny_trajs) + failed
    steps = extract_all(list(tiny_trajs) + held_out)
    return train, steps


def fitted(name: str, train, registry, embedder):
    res = Resources.build(registry, embedder, device="cpu", seed=0)
    res.slow = Resources.build(registry, KeywordEmbedder(SLOW_KEYWORDS), device="cpu", seed=0)
    scorer = build(name)
    report = scorer.fit(train, res)  # a record of the fit, not the scorer
    assert (isinstance(report, FitReport) and report.scorer == scorer.name
            and report.n_trajectories == len(train))
    assert report.seconds >= 0 and report.n_steps >= 0
    return scorer


@pytest.mark.parametrize("name", names("scorer"))
def test_scorer_conformance(name, corpus, tiny_registry, keyword_embedder):
    train, steps = corpus
    n, b = len(tiny_registry), len(steps)
    scorer = fitted(name, train, tiny_registry, keyword_embedder)
    assert scorer.name == name

    before = snapshot(scorer)
    scores = scorer.score(steps)
    assert same(before, snapshot(scorer)), f"{name}: score() changed the fitted state"

    assert scores.primary.shape == (b, n) and scores.fallback.shape == (b, n)
    assert scores.fell_back.shape == (b,) and scores.fell_back.dtype == torch.bool
    for diag in scores.diagnostics.values():
        assert diag.shape == (b,)
    if scores.guidance is not None:
        assert len(scores.guidance) == b and all(isinstance(g, str) for g in scores.guidance)

    for k in (1, 3, n):
        for pad in (True, False):
            sel = finalize(scores, k, pad)
            assert torch.equal(sel.ranking.sort(1).values, torch.arange(n).expand(b, n)), "not a permutation"
            for presented in sel.presented:
                assert len(set(presented)) == len(presented)
                assert set(presented) <= set(range(n))
                if scores.present_all:
                    assert sorted(presented) == list(range(n))
                else:
                    assert len(presented) <= k + len(scores.always_present)

    again = fitted(name, train, tiny_registry, keyword_embedder).score(steps)
    assert scores_equal(scores, again), f"{name}: not deterministic for a fixed seed"
    assert torch.equal(finalize(scores, 3).ranking, finalize(again, 3).ranking)


def test_snapshot_sees_a_changed_tensor(tiny_trajs, tiny_registry, keyword_embedder):
    scorer = fitted("toolnet", tiny_trajs, tiny_registry, keyword_embedder)
    before = snapshot(scorer)
    scorer.trie.edge_count[0] += 1
    assert not same(before, snapshot(scorer))


# ---- declared capabilities and the live path (one step) ---------------------------------------------
@pytest.mark.parametrize("name", names("scorer"))
def test_scorer_declares_every_capability(name, corpus, tiny_registry, keyword_embedder):
    train, steps = corpus
    scorer = fitted(name, train, tiny_registry, keyword_embedder)
    assert isinstance(scorer, Scorer)
    assert isinstance(scorer.pad, bool) and isinstance(scorer.successful_only, bool)
    assert (isinstance(scorer.global_set, tuple)
            and all(0 <= g < len(tiny_registry) for g in scorer.global_set))
    assert scorer.name in SAVEABLE if scorer.can_save else scorer.name not in SAVEABLE
    assert scorer.describe()["scorer"] == name
    contexts = scorer.embed(steps)
    assert all(c.shape == (len(steps), keyword_embedder.dim) for c in contexts)
    assert (len(contexts) > 0) == (scorer.rendering is not None)
    if not scorer.can_save:
        with pytest.raises(TypeError, match="cannot be saved"):
            scorer.save("never_written")


@pytest.mark.parametrize("name", names("scorer"))
def test_a_live_batch_of_one_equals_the_batched_ranking(name, corpus, tiny_registry, keyword_embedder):
    train, steps = corpus
    scorer = fitted(name, train, tiny_registry, keyword_embedder)
    scores = scorer.score(steps)
    ranking = finalize(scores, 1).ranking
    for k in (1, 3):
        presented = finalize(scores, k, scorer.pad).presented
        for i, step in enumerate(steps):
            assert scorer.select_one(step, scorer.embed([step]), k) == presented[i], (k, i)
    for i, step in enumerate(steps):
        assert np.array_equal(scorer.rank_one(step, scorer.embed([step])), ranking[i].numpy()), i
        assert np.array_equal(scorer.rank_one(step, scorer.embed([step]), top=2), ranking[i, :2].numpy()), i


@pytest.fixture(scope="module")
def bfcl_fold():
    """BFCL (registry as loaded), trajectories of fold 1 to fit on and the steps of fold 0, with the real
    MiniLM behind the shared disk cache."""
    from tracer.build import build_embedder
    from tracer.core.folds import assign_folds
    from tracer.data import load_dataset

    ds = load_dataset("bfcl", execute=False)
    fold_of = assign_folds([t.group for t in ds.trajectories], 5, 0)
    # 40 trajectories to fit on and 100 held-out steps: ~350 contexts to embed on a clean clone's cold cache
    train = [t for t in ds.trajectories if fold_of[t.group] == 1][:40]
    test = [s for s in extract_all([t for t in ds.trajectories if fold_of[t.group] == 0])
            if s.gold in ds.registry]
    res = Resources.build(ds.registry,
                          build_embedder("minilm", cache_dir=str(ROOT / ".cache" / "embeddings")),
                          device="cpu", seed=0)
    return res, train, test[:100]


@pytest.mark.parametrize("name, cfg", [("tracer_fixed", {}), ("tracer_g", {"pad": False}),
                                       ("tracer_plus", {"head": {"max_epochs": 30, "inner_folds": 3}})])
def test_single_step_path_equals_the_batched_path_on_bfcl_with_minilm(bfcl_fold, name, cfg):
    """The tracer family's live path (tracer.scoring.single_step) against the batched path: exact rankings."""
    res, train, test = bfcl_fold
    scorer = build_scorer(name, **cfg)
    scorer.fit(train, res)
    contexts = scorer.embed(test)
    scores = scorer.score_embedded(test, *contexts)
    assert 0 < int(scores.fell_back.sum()) < len(test) or name == "tracer_plus"
    ranking = finalize(scores, 1).ranking
    presented = finalize(scores, 5, scorer.pad).presented
    for i, step in enumerate(test):
        one = tuple(c[i:i + 1] for c in contexts)
        assert scorer.select_one(step, one, 5) == presented[i], i
        assert np.array_equal(scorer.rank_one(step, one), ranking[i].numpy()), i


def test_approximate_index_live_path_equals_its_batched_path_on_bfcl(bfcl_fold):
    """tracer_plus over an HNSW tool index retrieving 8 tools (so trie children outside the retrieved ones
    occur): the live step, which never scans the registry, presents and ranks as the batched path; the
    candidates a step gets are the retrieved top m and the trie's children, nothing else."""
    from dataclasses import replace

    from tracer.encode.index import ToolIndex
    from tracer.scorers.tracer_plus.step import retrieved_order

    res, train, test = bfcl_fold
    exact = res.tool_index
    ann = ToolIndex(exact.names, torch.from_numpy(exact.vectors), "HNSW32,Flat", ann_k=8, ef_search=16)
    assert not ann.exact
    res = replace(res, tool_index=ann)
    # the model served (no guard): on 40 logs the zero-shot ranking with usage vectors may win it
    scorer = build_scorer("tracer_plus", head={"max_epochs": 30, "inner_folds": 3},
                          zero_shot={"guard": False})
    scorer.fit(train, res)
    contexts = scorer.embed(test)
    scores = scorer.score_embedded(test, *contexts)
    assert (torch.isfinite(scores.fallback).sum(1) == 8).all()  # what the index retrieved, -inf elsewhere
    ranking = finalize(scores, 1).ranking
    presented = finalize(scores, 5, scorer.pad).presented
    far = 0
    for i, step in enumerate(test):
        one = tuple(c[i:i + 1] for c in contexts)
        assert scorer.select_one(step, one, 5) == presented[i], i
        assert np.array_equal(scorer.rank_one(step, one), ranking[i].numpy()), i
        cand, _, vec = scorer.score_step(step, *one)
        order = retrieved_order(vec)
        assert np.array_equal(order, ann.top_one(one[1][0].numpy())[0])
        far += int((~np.isin(cand.tool, order)).sum())
        assert set(order[:scorer.m].tolist()) <= set(cand.tool.tolist()), i
    assert far > 0  # some trie children were not retrieved: their features took the clipped rank and cosine
