"""Learning while serving on BFCL (tracer.online.incremental, tracer.online.updater): a train fold added in
ten chunks equals the batch build on it, for the trie scorers and the transition tables; tracer_plus's
tables updated in place (new nodes, edges and tools) equal a build from scratch; known edges are
updated in place as the merge would."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from trie_checks import assert_same_tries

from tracer.build import build_scorer
from tracer.core.folds import kfold
from tracer.core.steps import extract_all
from tracer.core.types import Registry
from tracer.online.incremental import update_scorer
from tracer.online.updater import Updater
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources
from tracer.scorer_base.single_step import children_one
from tracer.scorers.tracer_plus.index import PlusIndex
from tracer.scorers.tracer_plus.model import CandidateModel, save_candidate_model


class HashEmbedder:
    """Each distinct text -> a fixed pseudo-random unit vector (seeded by its SHA-256): equal texts share
    a context, as with a real encoder, at no encoding cost."""

    name, dim = "hash-unit", 32

    def encode(self, texts):
        out = np.stack([np.random.default_rng(
                            int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little"))
                        .standard_normal(self.dim) for t in texts]) if texts else np.zeros((0, self.dim))
        return torch.nn.functional.normalize(torch.from_numpy(out).float(), dim=1)  # [N, d]


@pytest.fixture(scope="module")
def bfcl():
    from tracer.data import load_dataset

    ds = load_dataset("bfcl", execute=False)
    split = kfold(ds.trajectories, 5, seed=0)[0]
    return Resources.build(ds.registry, HashEmbedder(), device="cpu"), list(split.train), list(split.test)


def seeded_weights(tmp_path) -> dict:
    """tracer_plus config with fixed seeded weights (transfer): the tries are under test, not the training."""
    names = build_scorer("tracer_plus").feature_names
    model = CandidateModel(len(names))
    with torch.no_grad():
        model.net.weight.copy_(torch.randn(1, len(names), generator=torch.Generator().manual_seed(0)))
    # no guard: the random weights must serve, or the rankings compared below would be the zero-shot one's
    return {"transfer": str(save_candidate_model(model, names, tmp_path / "model.pt")),
            "zero_shot": {"kind": "hybrid", "guard": False}}


@pytest.mark.parametrize("name", ["tracer_plus", "tracer_g", "toolnet", "autotool"])
def test_bfcl_train_fold_in_ten_chunks_equals_the_batch_build(bfcl, name, tmp_path):
    res, train, test = bfcl
    chunks = np.array_split(np.arange(len(train)), 10)
    cfg = seeded_weights(tmp_path) if name == "tracer_plus" else {}
    online = build_scorer(name, **cfg)
    online.fit([train[i] for i in chunks[0]], res)
    for idx in chunks[1:]:
        update_scorer(online, [train[i] for i in idx])
    batch = build_scorer(name, **cfg)
    batch.fit(train, res)
    assert_same_tries(online, batch)
    if name == "tracer_plus":  # the tables read off the tries too
        torch.testing.assert_close(online.index.tool_memory, batch.index.tool_memory, atol=1e-6, rtol=0)
        assert torch.equal(online.index.tool_log_freq, batch.index.tool_log_freq)
    steps = extract_all(test)
    ra, rb = finalize(online.score(steps), 5).ranking, finalize(batch.score(steps), 5).ranking
    assert (ra[:, :5] == rb[:, :5]).float().mean() > 0.999  # a tie at 1e-7 may swap two tools, no more


def assert_same_plus_index(a: PlusIndex, b: PlusIndex) -> None:
    """Every table of two tracer_plus indexes equal, bit for bit (and each torch table equal to its numpy
    twin)."""
    assert (a.tool_id == b.tool_id and np.array_equal(a.log_ranks, b.log_ranks)
            and len(a.tables) == len(b.tables))
    for x, y in zip(a.tables, b.tables):
        for f in ("log_visits", "log_children"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f
            assert np.array_equal(getattr(x, f"{f}_np"), getattr(y, f"{f}_np")), f
            assert np.array_equal(getattr(x, f).numpy(), getattr(x, f"{f}_np")), f
    assert torch.equal(a.tool_log_freq, b.tool_log_freq) and torch.equal(a.tool_memory, b.tool_memory)
    assert (np.array_equal(a.tool_log_freq_np, b.tool_log_freq_np)
            and np.array_equal(a.tool_memory64, b.tool_memory64)
            and np.array_equal(a.tool_mass64, b.tool_mass64))
    assert np.array_equal(a.tool_log_freq.numpy(), a.tool_log_freq_np)
    assert np.array_equal(a.tool_memory.numpy().astype(np.float64), a.tool_memory64)


def test_plus_index_updated_in_place_equals_a_build_with_new_nodes_edges_and_tools(bfcl, tmp_path):
    """tracer_plus's tables after each update (only the touched entries recomputed) equal a build from scratch
    on the updated tries, through in-place updates, merges that add nodes and edges, and a new tool."""
    res, train, _ = bfcl
    new_name = train[-1].messages[-2]["tool_calls"][0]["function"]["name"]  # a tool the last trajectory calls
    new_tool = res.registry.get(new_name)
    start = Resources.build(Registry([t for t in res.registry if t.name != new_name]), res.embedder,
                            device="cpu")
    scorer = build_scorer("tracer_plus", **seeded_weights(tmp_path))
    scorer.fit(train[:40], start)
    up = Updater(scorer)
    sizes = [[t.n_nodes, t.n_edges] for t in scorer.tries]
    merged = in_place = 0
    for lo in range(40, len(train), 60):
        ptrs = [t.edge_memory.data_ptr() for t in scorer.tries]
        up.update(train[lo:lo + 60], tools=[new_tool] if lo >= 400 else [])
        merged += any(t.edge_memory.data_ptr() != p for t, p in zip(scorer.tries, ptrs))
        in_place += any(t.edge_memory.data_ptr() == p for t, p in zip(scorer.tries, ptrs))
        assert_same_plus_index(scorer.index,
                               PlusIndex.build(scorer.tries, scorer.res.registry.names, res.embedder.dim))
    probe = extract_all(train[:3])
    ctx = scorer.embed(probe)[0].numpy()                                                # [P, d]
    for lo in range(12):  # one trajectory at a time, as served: mostly known edges, updated in place
        # the live path's caches exist: patched, not dropped
        scorer.select_one(probe[0], scorer.embed(probe[:1]), 5)
        up.update(train[lo:lo + 1])
        assert_same_plus_index(scorer.index,
                               PlusIndex.build(scorer.tries, scorer.res.registry.names, res.embedder.dim))
        for trie in scorer.tries:  # the patched live-path cache reads as one built afresh, bit for bit
            patched = [children_one(trie, trie.key.state(s), c) for s, c in zip(probe, ctx)]
            trie.single_step_cache = None
            for a, b in zip(patched, [children_one(trie, trie.key.state(s), c) for s, c in zip(probe, ctx)]):
                assert all(np.array_equal(getattr(a, f), getattr(b, f))
                           for f in ("tool", "count", "log_p", "sim", "log_l"))
    assert scorer.res.registry.names[-1] == new_name and scorer.index.tool_log_freq[-1] > 0
    assert (all(t.n_nodes > n and t.n_edges > e for t, (n, e) in zip(scorer.tries, sizes))
            and merged and in_place)


def test_known_edges_are_updated_in_place_as_the_merge_would(bfcl):
    res, train, _ = bfcl
    online = build_scorer("tracer_fixed")
    online.fit(train, res)
    trie = online.trie
    memory = trie.edge_memory.data_ptr()
    update_scorer(online, train[:3])  # logged again: every edge exists, so no merge
    assert trie.edge_memory.data_ptr() == memory
    batch = build_scorer("tracer_fixed")
    batch.fit(train + train[:3], res)
    assert_same_tries(online, batch)
