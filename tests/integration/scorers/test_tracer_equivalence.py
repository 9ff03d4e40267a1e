"""TracerScorer against itself and a reference: the single-step path's numbers against the batched ones
(BFCL, and a registry of 3,000 tools), a loaded index bit-identical to the saved one (a wrong embedder or
format refused), and the ranking rules (one definition in tracer.scorer_base.ranking) against two stable
sorts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tracer.build import build_scorer
from tracer.core.folds import kfold
from tracer.core.store import current_snapshot
from tracer.core.types import Registry, Step, Tool
from tracer.encode.index import ToolIndex
from tracer.memory.keys import StateKey
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.ranking import finalize, rank
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources, training_steps
from tracer.scorer_base.single_step import finalize_one, rank_one
from tracer.scorers.tracer import TracerScorer


class NoTextEmbedder:
    """For indexes built from precomputed vectors: a name and a dim, never encodes."""

    def __init__(self, dim, name="random-unit"):
        self.dim, self.name = dim, name

    def encode(self, texts):
        raise AssertionError("this test never embeds text")


# ---- the single-step path against the batched one, on BFCL ------------------------------------------
D = 32


@pytest.fixture(scope="module")
def bfcl_split():
    from tracer.data import load_dataset

    ds = load_dataset("bfcl", execute=False)
    split = kfold(ds.trajectories, 5, seed=0)[0]
    train, test = training_steps(split.train, ds.registry), training_steps(split.test, ds.registry)
    g = torch.Generator().manual_seed(0)
    unit = lambda n: torch.nn.functional.normalize(torch.randn(n, D, generator=g), dim=1)
    res = Resources(ds.registry, NoTextEmbedder(D), ToolIndex(ds.registry.names, unit(len(ds.registry))),
                    "cpu")
    return res, train, unit(len(train)), test, unit(len(test))


def fitted(bfcl_split, name: str, **cfg) -> TracerScorer:
    res, train, train_ctx, _, _ = bfcl_split
    sc = build_scorer(name, **cfg)
    trie = ExecutionTrie.build(train, res.tool_ids([s.gold for s in train]), train_ctx, len(res.registry),
                               sc.key, sc.eps)
    return sc.attach(trie, res)


LAST_2 = {"kind": "last_n", "n": 2, "cross_turn": True}


@pytest.mark.parametrize("name, cfg", [("tracer_fixed", {}), ("tracer_g", {}),
                                       ("tracer_fixed", {"key": LAST_2, "tau": 0.05})])
def test_score_one_gives_the_batched_numbers(bfcl_split, name, cfg):
    """The fixed blend's ``score_one``: the gate, kappa, fallback and child scores of ``score_embedded``, bit
    for bit (what it presents and ranks: ``test_live_step_equality.py``)."""
    sc = fitted(bfcl_split, name, **cfg)
    _, _, _, test, test_ctx = bfcl_split
    scores = sc.score_embedded(test, test_ctx)
    assert 0 < int(scores.fell_back.sum()) < len(test)  # both branches of the gate are exercised
    ctx = test_ctx.numpy()
    for i, st in enumerate(test):
        ch, s, fb, fell, kappa = sc.score_one(st, ctx[i])
        assert (fell == bool(scores.fell_back[i])
                and np.float32(kappa) == scores.diagnostics["kappa"][i].item())
        assert np.array_equal(fb, scores.fallback[i].numpy())
        assert np.array_equal(s, scores.primary[i, ch.tool].numpy())


# ---- persistence -----------------------------------------------------------------------------------
def scores_identical(a: Scores, b: Scores) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("primary", "fallback", "fell_back")) \
        and a.diagnostics.keys() == b.diagnostics.keys() \
        and all(torch.equal(a.diagnostics[d], b.diagnostics[d]) for d in a.diagnostics) \
        and a.always_present == b.always_present


def test_a_loaded_index_is_bit_identical(bfcl_split, tmp_path):
    sc = fitted(bfcl_split, "tracer_g", key={"kind": "prefix", "cross_turn": True})
    _, _, _, test, test_ctx = bfcl_split
    sc.save(tmp_path / "index")
    again = TracerScorer.load(tmp_path / "index", NoTextEmbedder(D), device="cpu")
    assert again.config() == sc.config() and again.global_set == sc.global_set
    a, b = sc.score_embedded(test, test_ctx), again.score_embedded(test, test_ctx)
    assert scores_identical(a, b)
    assert torch.equal(finalize(a, 5).ranking, finalize(b, 5).ranking)
    ctx = test_ctx.numpy()
    assert all(sc.select_one(st, (ctx[i],), 5) == again.select_one(st, (ctx[i],), 5)
               for i, st in enumerate(test))
    # saving over an existing index publishes a new snapshot and leaves no temporary directories
    sc.save(tmp_path / "index")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
    meta = json.loads((snapshot_of(tmp_path / "index") / "meta.json").read_text())
    assert meta["embedder"] == {"name": "random-unit", "dim": D} and meta["format_version"] == 2


def test_loading_with_another_embedder_or_format_is_refused(bfcl_split, tmp_path):
    sc = fitted(bfcl_split, "tracer_fixed")
    sc.save(tmp_path / "index")
    with pytest.raises(ValueError, match="built with embedder 'random-unit' \\(dim 32\\), not 'other'"):
        TracerScorer.load(tmp_path / "index", NoTextEmbedder(D, name="other"))
    with pytest.raises(ValueError, match="dim 32\\), not 'random-unit' \\(dim 16\\)"):
        TracerScorer.load(tmp_path / "index", NoTextEmbedder(16))
    meta_path = snapshot_of(tmp_path / "index") / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "format_version": 1}))
    with pytest.raises(ValueError, match="format version 1 is not 2"):
        TracerScorer.load(tmp_path / "index", NoTextEmbedder(D), verify="none")  # "sha256" refuses the edit
    with pytest.raises(FileNotFoundError, match="no saved index"):
        TracerScorer.load(tmp_path / "nothing", NoTextEmbedder(D))


def snapshot_of(index: Path) -> Path:
    return index / "snapshots" / current_snapshot(index)


# ---- ranking rules ---------------------------------------------------------------------------------
def two_stable_sorts(primary, fallback, fell_back):
    """The reference: by primary (desc), then fallback (desc), then registry position."""
    by_fallback = torch.sort(fallback, dim=1, descending=True, stable=True).indices
    prim = torch.nan_to_num(torch.where(fell_back[:, None], torch.zeros_like(primary), primary),
                            nan=float("-inf"))
    order = torch.sort(prim.gather(1, by_fallback), dim=1, descending=True, stable=True).indices
    return by_fallback.gather(1, order)


def test_rank_and_its_single_step_version_follow_the_reference_with_ties_and_infinities():
    g = torch.Generator().manual_seed(0)
    vals = torch.tensor([0.0, -0.0, 1.0, -1.0, float("-inf"), float("inf"), 0.5, float("nan"), 2.0])
    for trial in range(120):
        b, n = 6, 700 if trial % 40 == 0 else int(torch.randint(1, 30, (1,), generator=g))
        prim = vals[torch.randint(0, len(vals), (b, n), generator=g)]
        prim[torch.rand(b, n, generator=g) < 0.5] = float("-inf")
        fb = vals[torch.randint(0, len(vals) - 1, (b, n), generator=g)] if trial % 2 else \
            torch.randn(b, n, generator=g).round(decimals=1)
        fell = torch.rand(b, generator=g) < 0.3
        ref = two_stable_sorts(prim, fb, fell)
        assert torch.equal(rank(prim, fb, fell), ref), trial
        scores = Scores(primary=prim, fallback=fb, fell_back=fell, always_present=(0, n - 1))
        for i in range(b):
            prop = torch.nonzero(prim[i] != float("-inf")).squeeze(1)
            args = (prop.numpy(), prim[i, prop].numpy(), fb[i].numpy(), bool(fell[i]))
            assert np.array_equal(rank_one(*args), ref[i].numpy()), (trial, i)
            assert np.array_equal(rank_one(*args, top=3), ref[i, :3].numpy()), (trial, i)
            for k, pad in ((1, True), (3, False), (5, True)):
                assert finalize_one(*args, k, pad, (0, n - 1)) == finalize(scores, k, pad).presented[i]


def test_attach_refuses_a_trie_of_another_shape(bfcl_split):
    res = bfcl_split[0]
    with pytest.raises(ValueError, match="trie is over 3 tools"):
        build_scorer("tracer_fixed").attach(ExecutionTrie(3, D), res)
    with pytest.raises(ValueError, match="built with key"):
        build_scorer("tracer_fixed").attach(ExecutionTrie(len(res.registry), D, StateKey("last_n", 2)), res)


def test_single_step_path_equals_the_batched_path_on_a_large_registry():
    # 3,000 tools: the single-step path finds the fallback's leaders with a float32 pass and rescores them
    n, d = 3000, 24
    g = torch.Generator().manual_seed(3)
    unit = lambda m: torch.nn.functional.normalize(torch.randn(m, d, generator=g), dim=1)
    names = [f"t{i}" for i in range(n)]
    registry = Registry(Tool(x) for x in names)
    res = Resources(registry, NoTextEmbedder(d), ToolIndex(names, unit(n)), "cpu")
    rng = np.random.default_rng(0)
    states, tools = [], []
    for _ in range(3000):
        first = int(rng.integers(0, 40))
        nxt = int(rng.integers(0, n)) if rng.random() < 0.5 else first + 1
        states += [(), (names[first],)]
        tools += [first, nxt]
    trie = ExecutionTrie(n, d).update(states, torch.tensor(tools), unit(len(states)))
    sc = build_scorer("tracer_fixed", tau=0.3).attach(trie, res)
    steps = [Step("q", "q", 0, len(p), p, p, "", ()) for p in [(), (names[3],), ("unseen",)] * 20]
    ctx = unit(len(steps))
    scores = sc.score_embedded(steps, ctx)
    assert 0 < int(scores.fell_back.sum()) < len(steps)
    for k in (1, 5, 12):
        sel = finalize(scores, k)
        for i, st in enumerate(steps):
            assert sc.select_one(st, (ctx[i].numpy(),), k) == sel.presented[i]
            assert np.array_equal(sc.rank_one(st, (ctx[i].numpy(),), top=k), sel.ranking[i, :k].numpy())
