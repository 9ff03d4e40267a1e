"""Learning while serving (tracer.online.updates, tracer.online.updater, Retriever.update, the ``tracer
update`` CLI): updates in chunks equal a batch build on the union (BFCL), refits equal a batch fit and are
swapped in from a background thread, tools are added, removed and renamed without a rebuild, and a
transferred candidate model fits on zero trajectories."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from builders import TINY_TOOLS, KeywordEmbedder, call, fitted_scorer, result, tiny_trajectories

from tracer.build import build_fold_encoders, build_scorer
from tracer.cli import main as tracer_cli
from tracer.core.folds import kfold
from tracer.core.steps import extract_all
from tracer.core.store import CorruptIndex, current_snapshot, write_manifest
from tracer.core.types import Registry, Tool, Trajectory
from tracer.data import write_native
from tracer.memory.trie import ExecutionTrie
from tracer.online.updater import Updater
from tracer.online.updates import scorer_tries, update_scorer
from tracer.retriever import Retriever
from tracer.scorers.tracer_plus.index import PlusIndex
from tracer.scorers.tracer_plus.model import CandidateModel, save_candidate_model
from tracer.scoring.ranking import finalize
from tracer.scoring.records import Scores
from tracer.scoring.resources import Resources
from tracer.scoring.single_step import children_one

FAST_HEAD = {"max_epochs": 40, "patience": 10}


class HashEmbedder:
    """Each distinct text -> a fixed pseudo-random unit vector (seeded by its SHA-256): equal texts share
    a context, as with a real encoder, at no encoding cost."""

    name, dim = "hash-unit", 32

    def encode(self, texts):
        out = np.stack([np.random.default_rng(
                            int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little"))
                        .standard_normal(self.dim) for t in texts]) if texts else np.zeros((0, self.dim))
        return torch.nn.functional.normalize(torch.from_numpy(out).float(), dim=1)  # [N, d]


def assert_same_tries(a, b, atol=1e-6):
    """Node tables, CSR layout, counts and priors bit for bit; edge memories to float32 rounding."""
    ta, tb = scorer_tries(a), scorer_tries(b)
    assert len(ta) == len(tb) and ta
    for x, y in zip(ta, tb):
        assert x.node_states == y.node_states and x.nodes == y.nodes and x.n_tools == y.n_tools
        for f in ("indptr", "edge_tool", "edge_count", "node_count", "node_depth"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f
        if isinstance(x, ExecutionTrie):  # transition tables (ToolNet, AutoTool) hold counts only
            assert torch.equal(x.edge_log_p, y.edge_log_p)
            torch.testing.assert_close(x.edge_memory, y.edge_memory, atol=atol, rtol=0)
            torch.testing.assert_close(x.edge_norm, y.edge_norm, atol=atol * 10, rtol=1e-6)


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
    return {"transfer": str(save_candidate_model(model, names, tmp_path / "model.pt"))}


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
            and np.array_equal(a.tool_memory64, b.tool_memory64))
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


@pytest.fixture
def tiny_res():
    return Resources.build(Registry(TINY_TOOLS), KeywordEmbedder(), device="cpu")


def new_tool_trajectory() -> Trajectory:
    msgs = ({"role": "user", "content": "Book a flight and then email the booking"}, call("book_flight", 0),
            result(0), call("email_booking", 1), result(1))
    return Trajectory("n0", "n0", "tiny", msgs)


NEW_TOOL = Tool("email_booking", "Email the booking confirmation to the user")


@pytest.mark.parametrize("name", ["tracer", "tracer_plus"])
def test_new_tools_and_a_refit_equal_a_fit_on_the_union(tiny_res, name):
    trajs = tiny_trajectories()
    cfg = {"head": FAST_HEAD}
    r = Retriever(fitted_scorer(build_scorer(name, **cfg), trajs[:3], tiny_res))
    r.updater.trajectories = trajs[:3]
    out = r.update(trajs[3:] + [new_tool_trajectory()], tools=[NEW_TOOL, TINY_TOOLS[0]])
    assert out["new_tools"] == 1 and r.registry.names[-1] == "email_booking"
    assert r.updater.refit(wait=True) and len(r.updater.refits) == 1
    union = Resources.build(Registry(TINY_TOOLS + (NEW_TOOL,)), KeywordEmbedder(), device="cpu")
    batch = build_scorer(name, **cfg)
    batch.fit(trajs + [new_tool_trajectory()], union)
    assert_same_tries(r.scorer, batch)
    np.testing.assert_array_equal(r.res.tool_index.vectors, union.tool_index.vectors)
    learned = "model" if name == "tracer_plus" else "head"
    for (ka, va), (kb, vb) in zip(getattr(r.scorer, learned).state_dict().items(),
                                  getattr(batch, learned).state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka


def test_an_encoder_refit_fine_tunes_rebuilds_and_swaps_the_whole_scorer(minilm, tmp_path):
    """Updater(encoder=...): MiniLM fine-tuned on the updater's trajectories (a few dozen pairs), the scorer
    rebuilt over it and swapped into the retriever, equal to a batch fit with that encoder."""
    recipe = {"context": {"join_users": True}, "batch_size": 6, "lr": 1e-4, "epochs": 2, "max_seq_length": 48,
              "seed": 0, "device": "cpu", "encoder_dir": str(tmp_path / "encoders")}

    late = []  # logged from inside a refit, after it took its snapshot of the trajectories

    def encoder(trajectories, registry):
        out = build_fold_encoders(registry, recipe, None, device="cpu")(trajectories)
        while late:
            r.update([late.pop()])
        return out

    trajs, msgs = tiny_trajectories(), conversation("search_flights")
    res = Resources.build(Registry(TINY_TOOLS), minilm, device="cpu")
    r = Retriever(fitted_scorer(build_scorer("tracer_plus", head=FAST_HEAD), trajs[:3], res), k=3)
    old = r.scorer
    r.updater.encoder, r.updater.trajectories = encoder, list(trajs[:3])
    r.update(trajs[3:] + [new_tool_trajectory()], tools=[NEW_TOOL])
    r.updater.remove_tool("cancel_booking")
    assert r.updater.refit(wait=True)
    assert r.scorer is not old and r.updater.scorer is r.scorer and old.res.embedder is minilm
    assert "finetuned-" in r.res.embedder.name and r.updater.removed == {"cancel_booking"}
    assert "cancel_booking" not in r.rank(msgs) and len(r.rank(msgs)) == len(TINY_TOOLS)
    union = trajs + [new_tool_trajectory()]
    batch = build_scorer("tracer_plus", head=FAST_HEAD)
    # the same checkpoint, by content hash
    batch.fit(union, encoder(union, Registry(TINY_TOOLS + (NEW_TOOL,))))
    assert batch.res.embedder.name == r.res.embedder.name
    assert_same_tries(r.scorer, batch)
    for (ka, va), (kb, vb) in zip(r.scorer.model.state_dict().items(), batch.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    # a trajectory logged while a refit runs (same pairs as before: the checkpoint is reused) goes into the
    # old scorer at once and is caught up into the new one before the swap
    late.append(trajs[0])
    assert r.updater.refit(wait=True) and not late
    update_scorer(batch, trajs[:1])
    assert r.scorer.res.embedder.name == batch.res.embedder.name and len(r.updater.refits) == 2
    assert_same_tries(r.scorer, batch)


def test_scheduled_refit_runs_in_the_background_and_swaps_the_weights(tiny_res):
    trajs = tiny_trajectories()
    r = Retriever(fitted_scorer(build_scorer("tracer_plus", head=FAST_HEAD), trajs[:2], tiny_res))
    up = r.updater
    up.refit_every, up.trajectories = 3, list(trajs[:2])
    old = r.scorer.model
    # 2 < 3: the old weights serve
    assert not up.update(trajs[2:4])["refit_started"] and r.scorer.model is old
    assert up.update(trajs[4:])["refit_started"]
    up.wait()
    assert r.scorer.model is not old and up.refits[-1]["trajectories"] == 5 and up.since_refit == 0


def conversation(*calls, request="Find a flight from SFO to JFK and book it"):
    msgs = [{"role": "user", "content": request}]
    for i, name in enumerate(calls):
        msgs += [call(name, i), result(i)]
    return msgs


@pytest.mark.parametrize("name", ["tracer_fixed", "tracer_plus", "vector"])
def test_drift_add_remove_rename_without_a_rebuild(tiny_res, name):
    # the others have no head to train; the model served, as the guard would not on 5 trajectories
    fast = ({"head": FAST_HEAD, "zero_shot": {"kind": "vector", "guard": False}} if name == "tracer_plus"
            else {})
    r = Retriever(fitted_scorer(build_scorer(name, **fast), tiny_trajectories(), tiny_res), k=3)
    msgs = conversation("search_flights")
    before = r.rank(msgs)
    tries_before = [t.n_edges for t in scorer_tries(r.scorer)]
    states_renamed = [[tuple("reserve_flight" if n == "book_flight" else n for n in st)
                       for st in t.node_states]
                      for t in scorer_tries(r.scorer)]
    r.updater.remove_tool("book_flight")  # removed: gone from every ranking and selection at once
    assert r.rank(msgs) == [n for n in before if n != "book_flight"]
    assert [t["function"]["name"] for t in r.select(msgs)] == r.rank(msgs)[:3]
    assert all("book_flight" not in [t["function"]["name"] for t in sel]
               for sel in r.select_batch([msgs, msgs]))
    r.updater.add_tool(TINY_TOOLS[1])     # added back: as it was (its trie edges never left)
    assert r.rank(msgs) == before
    r.updater.add_tool(NEW_TOOL)          # a new tool: ranked by its fallback vector at once
    assert "email_booking" in r.rank(msgs) and len(r.rank(msgs)) == len(TINY_TOOLS) + 1
    r.updater.rename_tool("book_flight", "reserve_flight")  # renamed: same edges, new name in states
    after = r.rank(msgs)
    assert "book_flight" not in after and "reserve_flight" in after
    if name != "vector":  # the only child of (search_flights,), under its new name; no edge added or lost
        assert before[0] == "book_flight" and after[0] == "reserve_flight"
        assert [t.n_edges for t in scorer_tries(r.scorer)] == tries_before
        assert [t.node_states for t in scorer_tries(r.scorer)] == states_renamed
        assert all(t.node(st) == u for t in scorer_tries(r.scorer) for u, st in enumerate(t.node_states))


@pytest.mark.parametrize("name", ["tracer_fixed", "tracer_plus"])
def test_removed_tools_stay_removed_through_save_and_load(tiny_res, name, tmp_path):
    fast = {"head": FAST_HEAD} if name == "tracer_plus" else {}
    r = Retriever(fitted_scorer(build_scorer(name, **fast), tiny_trajectories(), tiny_res), k=3)
    msgs = conversation("search_flights")
    before = r.rank(msgs)
    r.updater.remove_tool("book_flight")
    r.save(tmp_path / "index")
    loaded = Retriever.load(tmp_path / "index", KeywordEmbedder(), k=3)
    assert (loaded.updater.removed == {"book_flight"}
            and loaded.rank(msgs) == [n for n in before if n != "book_flight"])
    assert [t["function"]["name"] for t in loaded.select(msgs)] == loaded.rank(msgs)[:3]
    assert all("book_flight" not in [t["function"]["name"] for t in sel]
               for sel in loaded.select_batch([msgs]))
    loaded.updater.add_tool(TINY_TOOLS[1])  # back as it was, and saved so
    assert loaded.rank(msgs) == before
    loaded.save(tmp_path / "index")
    assert Retriever.load(tmp_path / "index", KeywordEmbedder()).rank(msgs) == before
    # an index saved before the mask was (meta.json without "removed") loads with nothing removed
    r.save(tmp_path / "old")
    snap = tmp_path / "old" / "snapshots" / current_snapshot(tmp_path / "old")
    meta = json.loads((snap / "meta.json").read_text())
    (snap / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "removed"}))
    (snap / "MANIFEST.json").unlink()  # re-hashed: the snapshot verifies as one saved that way would
    write_manifest(snap)
    old = Retriever.load(tmp_path / "old", KeywordEmbedder())
    assert old.updater.removed == frozenset() and old.rank(msgs) == before
    (snap / "meta.json").write_text(json.dumps({**meta, "removed": ["no_such_tool"]}))
    (snap / "MANIFEST.json").unlink()
    write_manifest(snap)
    with pytest.raises(CorruptIndex, match="meta.json, field 'removed'"):
        Retriever.load(tmp_path / "old", KeywordEmbedder())


def test_transfer_fits_on_zero_trajectories_and_refuses_other_features(tiny_res, tmp_path):
    trained = build_scorer("tracer_plus", head=FAST_HEAD)
    trained.fit(tiny_trajectories(), tiny_res)
    path = save_candidate_model(trained.model, trained.feature_names, tmp_path / "model.pt")
    cold = build_scorer("tracer_plus", transfer=str(path))
    cold.fit([], tiny_res)
    assert all(t.n_edges == 0 for t in cold.tries)
    for (_, a), (_, b) in zip(cold.model.state_dict().items(), trained.model.state_dict().items()):
        assert torch.equal(a, b)
    steps = extract_all(tiny_trajectories())
    # cold (no logged call): every step is ranked by the vector query alone, batched and live alike
    scores = cold.score(steps)
    by_vector = Scores(primary=torch.full_like(scores.fallback, float("-inf")), fallback=scores.fallback,
                       fell_back=torch.ones(len(steps), dtype=torch.bool))
    assert cold.cold and bool(scores.fell_back.all())
    assert torch.equal(finalize(scores, 3).ranking, finalize(by_vector, 3).ranking)
    for i, s in enumerate(steps):
        assert cold.select_one(s, cold.embed([s]), 3) == finalize(by_vector, 3).presented[i]
    update_scorer(cold, tiny_trajectories()[:2])   # the first logged calls: the transferred weights take over
    assert not cold.cold and not bool(cold.score(steps).fell_back.all())
    with pytest.raises(ValueError, match="features"):
        build_scorer("tracer_plus", transfer=str(path), keys=["prefix"]).fit([], tiny_res)


@pytest.mark.slow  # 6-13 s: keeps make test under 5 minutes on a cold clone
def test_cli_update_adds_a_log_to_a_saved_index_and_refits(tmp_path, minilm, capsys):
    trajs = tiny_trajectories()
    res = Resources.build(Registry(TINY_TOOLS), minilm, device="cpu")
    Retriever(fitted_scorer(build_scorer("tracer"), trajs[:3], res)).save(tmp_path / "index")
    write_native(tmp_path / "history", Registry(TINY_TOOLS), trajs[:3])
    write_native(tmp_path / "log", Registry(TINY_TOOLS + (NEW_TOOL,)), trajs[3:] + [new_tool_trajectory()])
    cmd = [sys.executable, "-m", "tracer.cli", "update", "--index", str(tmp_path / "index"), "--log",
           str(tmp_path / "log"), "--cache-dir", str(tmp_path / "cache"), "--refit", "--history",
           str(tmp_path / "history")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["new_tools"] == 1 and report["refit"] is True
    loaded = Retriever.load(tmp_path / "index", minilm)
    batch = build_scorer("tracer")
    batch.fit(trajs + [new_tool_trajectory()],
              Resources.build(Registry(TINY_TOOLS + (NEW_TOOL,)), minilm, device="cpu"))
    assert_same_tries(loaded.scorer, batch)
    # the CLI refits in its own process (same data and seed; its float sums may run in another order, so
    # the weights agree to float error, not bit for bit)
    for (ka, a), (kb, b) in zip(loaded.scorer.head.state_dict().items(), batch.head.state_dict().items()):
        assert ka == kb
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    # a missing log: the same command's error path, in this process (a second interpreter start costs ~7 s)
    assert tracer_cli(cmd[3:6] + ["--log", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


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


def test_a_failed_refit_keeps_the_old_weights_and_says_why(tiny_res):
    trajs = tiny_trajectories()
    r = Retriever(fitted_scorer(build_scorer("tracer", head=FAST_HEAD), trajs, tiny_res))
    head = r.scorer.head
    r.updater.trajectories = trajs[:1]  # one group: the blend head's inner folds cannot run
    with pytest.raises(RuntimeError, match="refit on 1 trajectories failed"):
        r.updater.refit(wait=True)
    assert r.scorer.head is head
