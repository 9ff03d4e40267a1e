"""tracer_plus: features by hand, candidates against a naive union, inner folds, determinism, save/load.

The hand-checked corpus (keyword embedder from ``builders.py``; the memory and query renderings
keep the latest user message only, so a context embeds as the keywords of that message):

    A: "book a flight"  -> search_flights, book_flight
    B: "book a flight"  -> search_flights, book_flight | "send email" -> send_email
    C: "weather"        -> get_weather                 | "email it"   -> send_email

The test step opens the second turn of "weather ..." | "email please": prefix (), history
(get_weather,), context e_email. Registry ids: search_flights 0, book_flight 1, cancel_booking 2,
get_weather 3, send_email 4, list_files 5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from plus_hand import EPS, plus, traj

from tracer.core.folds import assign_folds
from tracer.core.steps import extract_all, extract_steps
from tracer.learn.trainer import TrainConfig
from tracer.memory.keys import StateKey, parse_key
from tracer.scorer_base.resources import fallback_scores, training_steps
from tracer.scorer_base.single_step import dense_scores_one
from tracer.scorers.tracer_plus.features import (
    GROUPS,
    candidates,
    candidates_one,
    feature_groups,
    feature_names,
    keep_mask,
)
from tracer.scorers.tracer_plus.fit import IGNORE, nll_on, train_model
from tracer.scorers.tracer_plus.inner_folds import CandidateData, build_index, inner_fold_candidates
from tracer.scorers.tracer_plus.model import CandidateModel
from tracer.scorers.tracer_plus.request import RequestEvidence


def test_features_by_hand(hand):
    scorer, step = hand
    mem, q = scorer.embed([step])
    cand = candidates(scorer.index, [step], mem, fallback_scores(scorer.res, q), scorer.m)
    # prefix root children: search_flights (A, B), send_email (B, C), get_weather (C); last call get_weather
    # -> send_email (C); vector top 3 of e_email: send_email, then ties at 0 in registry order:
    # search_flights, book_flight. Union = {0, 1, 3, 4}.
    assert cand.tool[0].tolist() == [0, 1, 3, 4] and cand.mask.all()
    names = feature_names(scorer.keys)
    row = {int(t): dict(zip(names, cand.feats[0, c].tolist())) for c, t in enumerate(cand.tool[0])}
    lv0, lc0 = math.log(1 + 5), math.log(1 + 3)           # root: N = 5 steps, 3 children
    lv1, lc1 = math.log(1 + 1), math.log(1 + 1)           # (get_weather,): N = 1, 1 child
    want = {
        # search_flights: a root child, count 2 of 5, memory of "book a flight" = (e_flight + e_book)/sqrt2,
        # cos 0
        0: {"prefix.member": 1, "prefix.log_p": math.log(2 / 5 + EPS), "prefix.log_r": math.log(EPS),
            "prefix.edge_cos": 0.0, "last_1+cross_turn.member": 0, "last_1+cross_turn.log_p": 0.0,
            "vec_cos": 0.0, "vec_rank": math.log(2), "vec_top": 1, "tool_log_freq": math.log(1 + 2),
            "tool_cos": 0.0, "hist_count": 0.0, "is_last": 0},
        # book_flight: only the vector search proposes it: every key feature at its neutral value 0
        1: {"prefix.member": 0, "prefix.log_p": 0.0, "prefix.log_r": 0.0, "prefix.edge_cos": 0.0,
            "prefix.member*log_visits": 0.0, "prefix.log_p*log_children": 0.0,
            "last_1+cross_turn.member": 0, "last_1+cross_turn.log_r": 0.0, "last_1+cross_turn.edge_cos": 0.0,
            "vec_cos": 0.0, "vec_rank": math.log(3), "vec_top": 1, "tool_log_freq": math.log(1 + 2)},
        # get_weather: a root child (1 of 5, memory e_weather, cos 0), called once before, the previous call
        3: {"prefix.member": 1, "prefix.log_p": math.log(1 / 5 + EPS), "prefix.log_r": math.log(EPS),
            "last_1+cross_turn.member": 0, "vec_rank": math.log(5), "vec_top": 0,
            "tool_log_freq": math.log(2), "hist_count": math.log(2), "in_turn": 0, "is_last": 1},
        # send_email: root child 2 of 5 with memory e_email (cos 1, all of the relu mass); the only child of
        # (get_weather,) with memory e_email
        4: {"prefix.member": 1, "prefix.log_p": math.log(2 / 5 + EPS), "prefix.log_r": math.log(1 + EPS),
            "prefix.edge_cos": 1.0, "prefix.edge_cos*log_visits": lv0, "prefix.log_p*log_children":
            math.log(2 / 5 + EPS) * lc0, "last_1+cross_turn.member": 1,
            "last_1+cross_turn.log_p": math.log(1 + EPS), "last_1+cross_turn.log_r": math.log(1 + EPS),
            "last_1+cross_turn.edge_cos": 1.0,
            "last_1+cross_turn.member*log_visits": lv1, "last_1+cross_turn.member*log_children": lc1,
            "vec_cos": 1.0, "vec_rank": 0.0, "vec_top": 1, "tool_log_freq": math.log(3), "tool_cos": 1.0},
    }
    for t, feats in want.items():
        for f, v in feats.items():
            assert row[t][f] == pytest.approx(v, abs=1e-5), (t, f)
        # state-level features are the state's, whether or not t is a child
        assert (row[t]["prefix.log_visits"] == pytest.approx(lv0)
                and row[t]["prefix.log_children"] == pytest.approx(lc0))
        assert row[t]["last_1+cross_turn.log_visits"] == pytest.approx(lv1)
    # the single-step path builds the same rows bit for bit
    one = candidates_one(scorer.index, step, mem[0].numpy(),
                         dense_scores_one(scorer.res.tool_index, q[0].numpy()), scorer.m)
    assert one.tool.tolist() == [0, 1, 3, 4] and one.in_state.tolist() == [True, True] and one.depth == 0
    assert np.array_equal(one.feats, cand.feats[0].numpy())


def test_feature_groups_and_keys():
    keys = [parse_key(k) for k in ("prefix", "last_2+cross_turn")]
    assert keys == [StateKey("prefix", 1, False), StateKey("last_n", 2, True)]
    assert parse_key({"kind": "last_n", "n": 1, "cross_turn": True}).label == "last_1+cross_turn"
    with pytest.raises(ValueError):
        parse_key("last_x")
    names = feature_names(keys)
    assert feature_groups("prefix.log_p*log_visits") == {"log_p", "state"}
    assert set().union(*(feature_groups(n) for n in names)) == set(GROUPS) - {"fusion", "request"}
    # zero_shot.candidates: the fusion's three features after the others
    fused = feature_names(keys, fusion=True)
    assert fused[:len(names)] == names and fused[len(names):] == ("zs_score", "zs_rank", "zs_top")
    assert set().union(*(feature_groups(n) for n in fused)) == set(GROUPS) - {"request"}
    # request: its features close the row, after the fusion's; the semantic ones are in the request group
    both = feature_names(keys, fusion=True, request=RequestEvidence(semantic=True).features)
    assert both[:len(fused)] == fused
    assert both[len(fused):] == ("req_bm25", "req_top", "req_name", "never_called", "req_cos", "req_open",
                                 "req_open_top")
    assert {g for n in both[len(fused):] for g in feature_groups(n)} == {"request"}
    assert set().union(*(feature_groups(n) for n in both)) == set(GROUPS)
    keep = keep_mask(names, ["state"])
    dropped = {n for n, k in zip(names, keep.tolist()) if k == 0}
    assert dropped == {n for n in names if "log_visits" in n or "log_children" in n}
    with pytest.raises(ValueError, match="unknown feature groups"):
        keep_mask(names, ["nope"])


def test_candidates_equal_a_naive_union(tiny_trajs, tiny_resources):
    scorer = plus(tiny_resources, vector_candidates=2)
    scorer.fit(tiny_trajs, tiny_resources)
    steps = extract_all(tiny_trajs)
    mem, q = scorer.embed(steps)
    vec = fallback_scores(tiny_resources, q)
    cand = candidates(scorer.index, steps, mem, vec, 2)
    for i, s in enumerate(steps):
        naive = set()
        for trie in scorer.tries:
            naive |= set(trie.children(trie.key.state(s)))
        naive |= set(sorted(range(vec.shape[1]), key=lambda t: (-float(vec[i, t]), t))[:2])
        assert cand.tool[i][cand.mask[i]].tolist() == sorted(naive)
    # without vector or request candidates an unseen state has none and the step falls back to the vector
    # ranking
    bare = plus(tiny_resources, keys=["last_2+cross_turn"], vector_candidates=0, request=None,
                zero_shot={"kind": "vector", "guard": False})  # the model served: its own fallbacks
    bare.fit(tiny_trajs, tiny_resources)
    new = extract_steps(traj("h", ("list my files and email them", ["list_files", "send_email"])))
    sc = bare.score(steps + new)
    # (list_files,) never had a successor
    assert sc.fell_back.tolist() == [False] * len(steps) + [False, True]
    assert (torch.equal(sc.fell_back, sc.diagnostics["n_children"] == 0)
            and torch.equal(sc.fell_back, ~sc.diagnostics["in_trie"]))
    assert bare.score(new[1:]).fell_back.tolist() == [True]                  # the single-step path agrees


def test_inner_folds_never_see_their_own_trajectory(tiny_trajs, tiny_resources):
    res = tiny_resources
    steps = training_steps(tiny_trajs, res.registry)
    scorer = plus(res)
    mem, q = scorer.embed(steps, res)
    vec, gold = fallback_scores(res, q), res.tool_ids([s.gold for s in steps])
    data = inner_fold_candidates(steps, gold, mem, vec, scorer.keys, 10, EPS, res.registry.names, "cpu", 3,
                                 seed=7)
    names = feature_names(scorer.keys)
    fold_of = assign_folds([s.group for s in steps], 3, 7)
    fold = [fold_of[s.group] for s in steps]
    order = sorted(range(len(steps)), key=lambda i: fold[i])  # the data's rows: grouped by inner fold
    assert data.fold.tolist() == [fold[i] for i in order]
    for f in sorted(set(fold)):
        held = [i for i in order if fold[i] == f]
        rows = [k for k, i in enumerate(order) if fold[i] == f]
        others = [i for i in range(len(steps)) if fold[i] != f]
        idx = build_index(scorer.keys, [steps[i] for i in others], gold[others], mem[others],
                          res.registry.names, EPS, "cpu")
        ref = candidates(idx, [steps[i] for i in held], mem[held], vec[held], 10)
        w = ref.feats.shape[1]
        assert torch.equal(data.feats[rows][:, :w], ref.feats) and not data.mask[rows][:, w:].any()
    # list_files is called in t4 only: while t4 is held out, no key and no tool table has seen it
    k = order.index(next(i for i, s in enumerate(steps) if s.trajectory_id == "t4"))
    col = int(data.gold[k])
    assert col != IGNORE  # the vector search still proposes it (top 10 of 6 tools)
    row = dict(zip(names, data.feats[k, col].tolist()))
    assert all(row[f"{key.label}.member"] == 0 for key in scorer.keys) and row["tool_log_freq"] == 0


def test_loss_is_cross_entropy_over_the_candidates():
    torch.manual_seed(0)
    model = CandidateModel(4, "linear")
    with torch.no_grad():
        model.net.weight.copy_(torch.tensor([[0.5, -1.0, 2.0, 0.1]]))
    feats = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    gold = torch.tensor([2, 4, IGNORE])
    data = CandidateData(feats, mask, gold, torch.zeros(3, dtype=torch.long))
    loss, correct = nll_on(model, data)()
    logits = (feats @ model.net.weight[0].detach()).masked_fill(~mask, float("-inf"))
    ref = (F.cross_entropy(logits[0:1], gold[0:1]) + F.cross_entropy(logits[1:2], gold[1:2])) / 2
    assert float(loss.detach()) == pytest.approx(float(ref), rel=1e-6)
    assert int(correct) == int((logits[:2].argmax(1) == gold[:2]).sum())
    # a step whose gold is not a candidate carries no gradient and is counted
    _, hist = train_model(data, "linear", 32,
                          TrainConfig(lr=0.05, weight_decay=1e-3, max_epochs=3, patience=2, batch_size=0,
                                      seed=0))
    assert hist["n_uncovered"] == 1


def test_fit_report_holds_the_curves_and_the_scorer_only_their_scalars(tiny_trajs, tiny_resources):
    scorer = plus(tiny_resources)
    report = scorer.fit(tiny_trajs, tiny_resources)
    assert report.scorer == "tracer_plus" and report.n_trajectories == len(tiny_trajs) and report.data is None
    assert len(report.history["val_loss"]) == report.history["epochs"] > 0
    assert scorer.history == {k: v for k, v in report.history.items() if not isinstance(v, list)}
