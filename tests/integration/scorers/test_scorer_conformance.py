"""Every registered scorer honours the interface; new scorers are covered by registering them.

For each scorer YAML in ``tracer/configs/scorer/``, built from it and fitted on the tiny corpus
(plus one failed trajectory) with the keyword embedder: the ranking is a permutation of the
registry, the presented set is a subset of it, two fits with the same seed give the same result,
scoring leaves the fitted state untouched, every capability of :class:`tracer.scorer_base.protocol.Scorer`
is declared, and a live step (``select_one`` / ``rank_one`` on ``embed([step])``) equals the batched
ranking. The scorers with a single-step path of their own are held equal to the batched path over BFCL with
the real MiniLM, setting by setting, in ``test_live_step_equality.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch
from builders import KeywordEmbedder, call, result

from tracer.build import build_scorer, load_config, names
from tracer.core.steps import extract_all
from tracer.core.types import Trajectory
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import Scorer
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources

SKIP_ATTRS = {"res", "executor",   # shared resources (the embedder's cache grows as it encodes)
              "single_step_cache"}  # a trie's CPU views, made on its first scored step
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
