"""tracer_plus: fits deterministic and equal on the live and batched paths, the MLP ensemble, selection from
messages, save/load bit for bit, and the index's tool tables (the hand corpus: tests/plus_hand.py)."""


from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from builders import KeywordEmbedder
from plus_hand import EPS, FAST, HAND_TEST, HAND_TRAIN, plus

from tracer.core.folds import inner_seed
from tracer.core.steps import extract_all
from tracer.core.store import current_snapshot
from tracer.retriever import Retriever
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import fallback_scores, training_steps
from tracer.scorers.tracer_plus import TracerPlusScorer
from tracer.scorers.tracer_plus.fit import train_model
from tracer.scorers.tracer_plus.index import PlusIndex
from tracer.scorers.tracer_plus.inner_folds import inner_fold_candidates
from tracer.scorers.tracer_plus.model import load_candidate_model, save_candidate_model


@pytest.mark.parametrize("model,members", [("linear", 1), ("mlp", 1), ("mlp", 3)])
def test_fit_is_deterministic_and_single_step_matches_batch(model, members, tiny_trajs, tiny_resources):
    steps = extract_all(tiny_trajs)
    a = plus(tiny_resources, model=model, head={**FAST, "members": members})
    a.fit(tiny_trajs, tiny_resources)
    b = plus(tiny_resources, model=model, head={**FAST, "members": members})
    b.fit(tiny_trajs, tiny_resources)
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    sa, sb = a.score(steps), b.score(steps)
    assert torch.equal(sa.primary, sb.primary) and torch.equal(sa.fallback, sb.fallback)
    assert sa.diagnostics["in_candidates"].tolist() == [1.0] * len(steps)   # every gold is a candidate here
    ranking = finalize(sa, 3).ranking
    mem, q = a.embed(steps)
    for i, s in enumerate(steps):
        one = a.score_embedded([s], mem[i:i + 1], q[i:i + 1])          # a batch of one
        assert torch.allclose(one.primary, sa.primary[i:i + 1], rtol=1e-6, atol=1e-6)
        assert np.array_equal(a.rank_one(s, (mem[i], q[i])), ranking[i].numpy())
        assert a.select_one(s, (mem[i], q[i]), 3) == finalize(sa, 3).presented[i]


def test_mlp_ensemble_is_the_mean_of_its_members_each_trained_alone(tiny_trajs, tiny_resources):
    """Member i is exactly the single MLP trained with seed + i (same rows, split and statistics), and the
    ensemble's scores are their mean, in the batched (torch) and the single-step (numpy) paths."""
    res = tiny_resources
    ens = plus(res, model="mlp", head={**FAST, "members": 3, "seed": 5})
    ens.fit(tiny_trajs, res)
    assert ens.model.members == 3 and ens.history["members"] == 3 and len(ens.model.mlps) == 3
    # a single fit seeded 5 + i would also move the inner split; members share the ensemble's (seed 5), so
    # each is compared with a single MLP trained on the ensemble's own out-of-fold candidates
    steps = training_steps(tiny_trajs, res.registry, True)
    mem, q = ens.embed(steps)
    data = inner_fold_candidates(steps, res.tool_ids([s.gold for s in steps]), mem, fallback_scores(res, q),
                                 ens.keys, ens.m, EPS, res.registry.names, "cpu", FAST["inner_folds"],
                                 inner_seed(5, 0), request=ens.request.inputs(steps, res))
    for i, net in enumerate(ens.model.mlps):
        alone, _ = train_model(data, "mlp", 32, ens.train_config(5 + i), keep=ens.keep)
        for (ka, va), (kb, vb) in zip(net.state_dict().items(), alone.net.state_dict().items()):
            assert ka == kb and torch.equal(va, vb), (i, ka)
        assert torch.equal(ens.model.mean, alone.mean) and torch.equal(ens.model.std, alone.std)
    test = extract_all(tiny_trajs)
    mem, q = ens.embed(test)
    cand = ens.candidates(test, mem, fallback_scores(res, q))
    z = ens.model.standardise(cand.feats.double())                                    # [B, C, F]
    by_hand = sum(net.double()(z).squeeze(-1) for net in copy.deepcopy(ens.model.mlps)) / 3     # [B, C]
    got = ens.model.scores(cand.feats, cand.mask)
    assert torch.equal(got[cand.mask], by_hand.float()[cand.mask])
    for i in range(len(test)):
        row = cand.feats[i][cand.mask[i]].numpy()
        assert np.array_equal(ens.model.scores_one(row), got[i][cand.mask[i]].numpy())


def test_ensemble_needs_an_mlp_and_at_least_one_member(tiny_resources):
    with pytest.raises(ValueError, match="head.members"):
        plus(tiny_resources, model="linear", head={**FAST, "members": 2})
    with pytest.raises(ValueError, match="head.members"):
        plus(tiny_resources, model="mlp", head={**FAST, "members": 0})
    with pytest.raises(ValueError, match="linear or mlp"):
        plus(tiny_resources, model="gbdt")


def test_select_from_messages(hand):
    scorer, step = hand
    names = [t["function"]["name"] for t in Retriever(scorer).select(list(step.context), k=2)]
    assert names[0] == "send_email" and len(names) == 2
    mem, q = scorer.embed([step])
    assert [scorer.res.registry.id(n) for n in names] == list(scorer.select_one(step, (mem[0], q[0]), 2))


def test_save_load_is_bit_identical(hand, tmp_path):
    scorer, _ = hand
    steps = extract_all([*HAND_TRAIN, HAND_TEST])
    before = scorer.score(steps)
    out = scorer.save(tmp_path / "idx")
    scorer.save(tmp_path / "idx")  # a second save publishes a new snapshot
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    meta = json.loads((out / "snapshots" / current_snapshot(out) / "meta.json").read_text())
    assert meta["features"] == list(scorer.feature_names) and len(meta["tries"]) == 2
    loaded = TracerPlusScorer.load(out, scorer.res.embedder, device="cpu")
    after = loaded.score(steps)
    for f in ("primary", "fallback", "fell_back"):
        assert torch.equal(getattr(before, f), getattr(after, f)), f
    assert before.diagnostics.keys() == after.diagnostics.keys()
    for d in before.diagnostics:
        assert torch.equal(before.diagnostics[d], after.diagnostics[d]), d
    msgs = list(HAND_TEST.messages[:4])
    assert Retriever(loaded).select_ids(msgs, 3) == Retriever(scorer).select_ids(msgs, 3)
    with pytest.raises(ValueError, match="embedder"):
        TracerPlusScorer.load(out, KeywordEmbedder(("flight", "book")))


def test_ensemble_save_load_and_transfer_file_round_trip(tiny_trajs, tiny_resources, tmp_path):
    ens = plus(tiny_resources, model="mlp", head={**FAST, "members": 2})
    ens.fit(tiny_trajs, tiny_resources)
    steps = extract_all(tiny_trajs)
    loaded = TracerPlusScorer.load(ens.save(tmp_path / "idx"), tiny_resources.embedder, device="cpu")
    assert loaded.members == 2 and torch.equal(loaded.score(steps).primary, ens.score(steps).primary)
    path = save_candidate_model(ens.model, ens.feature_names, tmp_path / "model.pt")
    again = load_candidate_model(path, ens.feature_names, "mlp", 32, 2)
    assert again.members == 2
    for (ka, va), (kb, vb) in zip(again.state_dict().items(), ens.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    # a scorer configured otherwise would save its own config beside these weights and fail to load them
    for hidden, members in ((32, 1), (16, 2)):
        with pytest.raises(ValueError,
                           match=f"members 2.*this scorer is mlp \\(hidden {hidden}, members {members}\\)"):
            load_candidate_model(path, ens.feature_names, "mlp", hidden, members)
    one = plus(tiny_resources, model="mlp", transfer=str(path))
    with pytest.raises(ValueError, match="members 2"):
        one.fit(tiny_trajs, tiny_resources)
    two = plus(tiny_resources, model="mlp", head={**FAST, "members": 2}, transfer=str(path))
    two.fit(tiny_trajs, tiny_resources)
    assert torch.equal(two.score(steps).primary, ens.score(steps).primary)  # the same weights, the same tries


def test_plus_index_tool_tables(hand):
    scorer, _ = hand
    idx: PlusIndex = scorer.index
    # every training step is one edge of the first trie: called counts A,B,C -> 2, 2, 0, 1, 2, 0
    assert torch.allclose(idx.tool_log_freq, torch.log1p(torch.tensor([2.0, 2, 0, 1, 2, 0])))
    assert float(idx.tool_memory[5].norm()) == 0.0 and float(idx.tool_memory[4].norm()) == pytest.approx(1.0)
