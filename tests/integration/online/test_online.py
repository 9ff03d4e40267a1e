"""Learning while serving (tracer.online.incremental, tracer.online.updater, Retriever.update, the ``tracer
update`` CLI) on the tiny dataset: refits equal a batch fit and are swapped in from a background thread,
tools are added, removed and renamed without a rebuild, and a transferred candidate model fits on zero
trajectories. Updates in chunks against a batch build on BFCL: test_online_bfcl.py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from builders import TINY_TOOLS, KeywordEmbedder, call, fitted_scorer, result, tiny_trajectories
from trie_checks import assert_same_tries

from tracer.build import build_fold_encoders, build_scorer
from tracer.cli import main as tracer_cli
from tracer.core.steps import extract_all
from tracer.core.store import CorruptIndex, current_snapshot, write_manifest
from tracer.core.types import Registry, Tool, Trajectory
from tracer.data import write_native
from tracer.online.incremental import scorer_tries, update_scorer
from tracer.online.transfer import fit_transfer_model
from tracer.retriever import Retriever
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources
from tracer.scorers.tracer_plus.model import save_candidate_model

FAST_HEAD = {"max_epochs": 40, "patience": 10}


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


@pytest.mark.heavy(seconds=10)
def test_an_encoder_refit_fine_tunes_rebuilds_and_swaps_the_whole_scorer(minilm, tmp_path, tiny_bert_dir):
    """Updater(encoder=...): an encoder fine-tuned on the updater's trajectories (a few dozen pairs; the tiny
    BERT as its base, so the refit also changes the vectors' width from MiniLM's), the scorer rebuilt over it
    and swapped into the retriever, equal to a batch fit with that encoder."""
    recipe = {"context": {"join_users": True}, "batch_size": 6, "lr": 1e-4, "epochs": 2, "max_seq_length": 48,
              "seed": 0, "device": "cpu", "encoder_dir": str(tmp_path / "encoders"),
              "base_model": str(tiny_bert_dir)}

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


@pytest.mark.parametrize("fusion_candidates", [False, True])
def test_a_transfer_model_has_the_columns_of_the_scorer_it_is_for(tiny_res, tmp_path, fusion_candidates):
    # the default scorer's request evidence (and the fusion, where it proposes candidates) are columns of
    # the target's features: a model trained on the sources without them could not be loaded (width 50 vs 57)
    cfg = {"head": FAST_HEAD, "zero_shot": {"kind": "hybrid", "guard": True, "candidates": fusion_candidates}}
    source = build_scorer("tracer_plus", **cfg)
    assert source.request is not None
    model, _ = fit_transfer_model(source, [(tiny_trajectories(), tiny_res)])
    path = save_candidate_model(model, source.feature_names, tmp_path / "model.pt")
    cold = build_scorer("tracer_plus", **cfg, transfer=str(path))
    cold.fit(tiny_trajectories()[:3], tiny_res)
    for (_, a), (_, b) in zip(cold.model.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b)
    steps = extract_all(tiny_trajectories())
    assert finalize(cold.score(steps), 3).ranking.shape == (len(steps), len(TINY_TOOLS))


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


def test_a_failed_refit_keeps_the_old_weights_and_says_why(tiny_res):
    trajs = tiny_trajectories()
    r = Retriever(fitted_scorer(build_scorer("tracer", head=FAST_HEAD), trajs, tiny_res))
    head = r.scorer.head
    r.updater.trajectories = trajs[:1]  # one group: the blend head's inner folds cannot run
    with pytest.raises(RuntimeError, match="refit on 1 trajectories failed"):
        r.updater.refit(wait=True)
    assert r.scorer.head is head


def test_tracer_g_presents_each_tool_once_after_a_removal(tiny_res):
    """With a tool removed, Tracer+G presents the top k of the ranking without it, then the global-set tools
    not already there and not removed: as finalize presents without drift, each tool once."""
    r = Retriever(fitted_scorer(build_scorer("tracer_g"), tiny_trajectories(), tiny_res), k=3)
    g = r.scorer.global_set
    msgs = conversation("search_flights")
    gone = next(n for n in r.rank(msgs) if r.registry.id(n) not in g)
    r.updater.remove_tool(gone)
    ranked = [r.registry.id(n) for n in r.rank(msgs)]
    head = tuple(ranked[:3])
    want = head + tuple(i for i in g if i not in head and r.registry.names[i] != gone)
    assert set(head) & set(g)  # the case: a global-set tool is also among the top k
    assert r.select_ids(msgs) == want
    assert [[t["function"]["name"] for t in sel] for sel in r.select_batch([msgs])] == [
        [r.registry.names[i] for i in want]]
