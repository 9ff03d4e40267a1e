"""tracer_plus's request evidence (tracer/scorers/tracer_plus/request.py): features by hand, the request's
BM25 key among the candidates, live rows equal to batched ones bit for bit, and the mechanism it exists for:
a request that names a tool outranks a log habit of 10 to 1 for the following call."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from plus_hand import FAST, traj

from tracer.build import build_scorer
from tracer.core.steps import extract_all, extract_steps
from tracer.encode.index import ToolIndex
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorers.bm25 import BM25Scorer
from tracer.scorers.tracer_plus.features import candidates_one, retrieved_order
from tracer.scorers.tracer_plus.fit import choose_open_slot
from tracer.scorers.tracer_plus.inner_folds import CandidateData
from tracer.scorers.tracer_plus.request import (
    REQUEST_FEATURES,
    SEMANTIC_FEATURES,
    RequestEvidence,
    RequestInput,
)

CONTEXT = {"window": "since_user", "calls": "names", "results": "none"}
# after get_weather the logs send an email ten times and list the files once; other requests name their tools
HABIT = ([traj(f"w{i}", (f"weather in city {i} then email it", ["get_weather", "send_email"]))
          for i in range(10)]
         + [traj("l", ("weather and then list the files", ["get_weather", "list_files"]))]
         + [traj(f"n{i}", (text, [tool])) for i, (text, tool) in enumerate([
             ("list my files", "list_files"), ("cancel the booking", "cancel_booking"),
             ("search flights to Boston", "search_flights"), ("send an email to Bob", "send_email"),
             ("book a flight", "book_flight"), ("list all files here", "list_files"),
             ("cancel my booking now", "cancel_booking"), ("search flights tomorrow", "search_flights")])])


def fitted(res, **cfg):
    cfg.setdefault("zero_shot", {"kind": "hybrid", "guard": False})
    cfg.setdefault("query_context", CONTEXT)
    cfg.setdefault("memory_context", CONTEXT)
    scorer = build_scorer("tracer_plus", keys=["prefix", "last_1+cross_turn"], vector_candidates=2,
                          head=FAST, **cfg)
    scorer.fit(HABIT, res)
    return scorer


def test_request_features_by_hand(tiny_resources):
    res = tiny_resources
    scorer = fitted(res, request={"candidates": 2, "semantic": False, "open_slot": False})
    step = extract_steps(traj("t", ("the weather then list the files", ["get_weather", "list_files"])))[1]
    inp = scorer.request.inputs([step], res)
    bm25 = BM25Scorer(name="bm25", context={"calls": "none", "join_users": True}, k1=1.5, b=0.75)
    bm25.fit([], res)
    want = bm25.query_scores(["weather", "list", "files"])                  # "the", "then": stopwords
    assert np.array_equal(inp.bm25[0], want.astype(np.float32))
    names = res.registry.names
    top = [names[t] for t in np.flatnonzero(inp.top[0])]
    assert set(top) == {names[t] for t in np.argsort(-want, kind="stable")[:2]} and "list_files" in top
    tool = np.arange(len(names))
    never = np.array([n == "book_flight" for n in names])
    rows = dict(zip(names, inp.rows(0, tool, never).tolist()))
    best = float(want.max())
    for name in names:
        i = names.index(name)
        assert rows[name][0] == pytest.approx(float(want[i]) / best)
    assert rows["list_files"][2] == 1.0 and rows["get_weather"][2] == 0.5 and rows["send_email"][2] == 0.0
    assert rows["book_flight"][3] == 1.0 and rows["list_files"][3] == 0.0
    assert scorer.feature_names[-4:] == REQUEST_FEATURES                            # they close each row
    with pytest.raises(ValueError, match="request.candidates"):
        RequestEvidence(candidates=-1)
    with pytest.raises(ValueError, match="request.clause_top"):
        RequestEvidence(clause_top=True)
    with pytest.raises(TypeError, match="request.semantic"):
        RequestEvidence(semantic="yes")


def test_semantic_request_features_by_hand(tiny_resources):
    # the keyword embedder: "the weather" is the weather axis, "list the files" the file axis, the whole
    # request both, (weather + file) / sqrt(2); get_weather's text is the weather axis, list_files' the
    # file axis
    res = tiny_resources
    scorer = fitted(res, request={"candidates": 0, "semantic": True, "clause_top": 2})
    asked = traj("t", ("the weather then list the files", ["get_weather", "list_files"]))
    first, second = extract_steps(asked)
    inp = scorer.request.inputs([first, second], res)
    assert inp.features == REQUEST_FEATURES + SEMANTIC_FEATURES == scorer.feature_names[-7:]
    names = res.registry.names
    half = np.float32(1 / np.sqrt(2))
    sem = {name: inp.sem[:, names.index(name)].tolist() for name in names}      # [2 steps][3 features]
    for i in range(2):  # the request alone: the same before and after the first call
        assert sem["get_weather"][i][0] == pytest.approx(half)
        assert sem["list_files"][i][0] == pytest.approx(half)
        assert sem["book_flight"][i][0] == 0.0
    # before any call both parts are open; once get_weather is called, only "list the files" is
    assert sem["get_weather"][0][1:] == [pytest.approx(1.0), 1.0] and sem["list_files"][0][1:] == [1.0, 1.0]
    assert sem["get_weather"][1][1:] == [0.0, 0.0]
    assert sem["list_files"][1][1:] == [pytest.approx(1.0), 1.0]
    # top matches must match: the tools tied at cosine 0 are not flagged, whatever their registry order
    assert [names[t] for t in np.flatnonzero(inp.top[1])] == ["list_files"]
    assert {name for name in names if sem[name][0][2]} == {"get_weather", "list_files"}


def test_a_request_naming_a_tool_outranks_a_log_habit_of_ten_to_one(tiny_resources):
    res = tiny_resources
    step = extract_steps(traj("t", ("weather in Rome then list the files", ["get_weather", "list_files"])))[1]
    names = res.registry.names
    first = {}
    for request in ({"candidates": 10}, None):
        scorer = fitted(res, request=request)
        assert not scorer.zero_shot_only
        ranking = finalize(scorer.score([step]), 1).ranking[0]
        first[request is not None] = names[int(ranking[0])]
        assert scorer.rank_one(step, scorer.embed([step]))[0] == ranking[0]                # live = batched
    assert first == {True: "list_files", False: "send_email"}
    weights = scorer_weights(fitted(res, request={"candidates": 10}))
    assert weights["req_name"] > 0 or weights["req_bm25"] > 0


def scorer_weights(scorer) -> dict:
    return scorer.describe()["weights"]


@pytest.mark.parametrize("index", ["exact", "hnsw"])
def test_request_candidates_and_features_live_as_batched(tiny_registry, keyword_embedder, index, tmp_path):
    exact = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    ann = ToolIndex(exact.tool_index.names, torch.from_numpy(exact.tool_index.vectors), "HNSW16,Flat",
                    ann_k=3, ef_search=8)
    res = exact if index == "exact" else replace(exact, tool_index=ann)
    scorer = fitted(res)                                           # the default request config
    assert scorer.config()["request"] == {"candidates": 10, "bm25": {"k1": 1.5, "b": 0.75}, "semantic": True,
                                          "clause_top": 2, "open_slot": True}
    asked = traj("q", ("what is the forecast then list the files", ["get_weather", "list_files"]))
    steps = extract_all([asked, *HABIT[10:14]])
    mem, q = scorer.embed(steps)
    vec = fallback_scores(res, q)                                                     # [B, N]
    batch = scorer.candidates(steps, mem, vec)
    assert batch.feats.shape[2] == len(scorer.feature_names) == 2 * 14 + 8 + 4 + 3
    inp = scorer.request.inputs(steps, res)
    for i, step in enumerate(steps):  # the live rows, bit for bit, and the request's top BM25 among them
        one = candidates_one(scorer.index, step, mem[i].numpy(), vec[i].numpy(), 2,
                             None if res.tool_index.exact else retrieved_order(vec[i].numpy()), None,
                             inp.take([i]))
        width = len(one.tool)
        assert batch.tool[i, :width].tolist() == one.tool.tolist() and not batch.mask[i, width:].any()
        assert torch.equal(batch.feats[i, :width], torch.from_numpy(one.feats)), i
        assert set(np.flatnonzero(inp.top[i])) <= set(one.tool.tolist())
    scores = scorer.score(steps)
    presented = finalize(scores, 3, scorer.pad).presented
    assert [scorer.select_one(s, (mem[i:i + 1], q[i:i + 1]), 3) for i, s in enumerate(steps)] == presented
    if index == "exact":  # a saved index keeps the setting; one saved before it loads without it
        loaded = type(scorer).load(scorer.save(tmp_path / "idx"), keyword_embedder, "cpu")
        assert loaded.feature_names == scorer.feature_names
        assert finalize(loaded.score(steps), 3, loaded.pad).presented == presented
        old = build_scorer("tracer_plus", **{**scorer.config(), "request": None})
        assert old.request is None and "never_called" not in old.feature_names
        # saved before the semantic evidence: its request config has no `semantic`, and it reads as off
        saved = {"candidates": 10, "bm25": {"k1": 1.5, "b": 0.75}}
        lexical = type(scorer)(**{**scorer.config(), "request": saved})
        assert lexical.feature_names[-4:] == REQUEST_FEATURES and "req_cos" not in lexical.feature_names


def test_the_open_part_of_the_request_claims_a_slot_after_the_first_call(tiny_resources):
    res = tiny_resources
    names = res.registry.names
    asked = traj("t", ("get the weather in Rome then list the files", ["get_weather", "list_files"]))
    first, second = extract_steps(asked)
    presented = {}
    for open_slot in (True, False):
        # a model that reads only the last message and drops the request's features follows the habit:
        # get_weather, then send_email
        last = {"window": "last_n", "n": 1, "calls": "names", "results": "none"}
        scorer = fitted(res, request={"candidates": 0, "semantic": True, "open_slot": open_slot},
                        zero_shot={"kind": "vector", "guard": False, "novel": 0},
                        features={"drop": ["request"]}, query_context=last, memory_context=last)
        inp = scorer.request.inputs([first, second], res)
        # before any call nothing is done and nothing claims; after get_weather, "list the files" is open
        assert inp.claims == ([(), (names.index("list_files"),)] if open_slot else None)
        presented[open_slot] = finalize(scorer.score([first, second]), 2, scorer.pad).presented
        live = [scorer.select_one(s, scorer.embed([s]), 2) for s in (first, second)]
        assert live == presented[open_slot]                                              # live = batched
        if open_slot:  # the fit judged the slot on the logs; where it loses recall there, it does not serve
            assert scorer.history["open_slot"] is True and scorer.open_slot_serves
            scorer.history["open_slot"] = False
            assert finalize(scorer.score([first, second]), 2, scorer.pad).presented[1] != presented[True][1]
            assert scorer.select_one(second, scorer.embed([second]), 2) != presented[True][1]
    # the first slot stays the model's (the habit's send_email); the open part's best match takes the last
    assert [[names[t] for t in p] for p in presented[False]] == [["get_weather", "list_files"],
                                                                 ["send_email", "search_flights"]]
    assert [[names[t] for t in p] for p in presented[True]] == [["get_weather", "list_files"],
                                                                ["send_email", "list_files"]]
    with pytest.raises(ValueError, match="open_slot needs request.semantic"):
        RequestEvidence(semantic=False, open_slot=True)


def test_reserve_takes_novel_and_open_part_claimants_in_turn():
    inp = RequestEvidence(candidates=0)  # the merge alone: claims as inputs() leaves them
    req = RequestInput(np.zeros((3, 4), np.float32), np.zeros((3, 4), bool), [frozenset()] * 3, [], None,
                       [(), (2,), (3, 1)])
    # a novel claimant, then an open part's, then the next novel one; an id claimed twice counts once
    assert req.reserve([(1,), (2, 0), (0, 2)]) == [(1,), (2, 0), (0, 3, 2, 1)]
    assert req.reserve(None) == [(), (2,), (3, 1)]
    assert replace(req, claims=None).reserve([(1,)]) == [(1,)]
    assert replace(req, claims=None).reserve(None) is None
    assert inp.config()["open_slot"] is False


def test_the_open_slot_serves_unless_it_loses_recall_on_the_logs():
    # three training steps, each with candidates 0, 1, 2 scored 3 > 2 > 1, k = 2: the model presents 0, 1 and
    # the slot would present 0, 2 (tool 2 is every step's open-part claimant)
    def data(golds):
        s = len(golds)
        return CandidateData(torch.zeros(s, 3, 1), torch.ones(s, 3, dtype=torch.bool),
                             torch.tensor(golds), torch.zeros(s, dtype=torch.long),
                             torch.tensor([[0, 1, 2]] * s), torch.arange(s))
    scores = torch.tensor([[3.0, 2.0, 1.0]] * 3)
    claims = [(2,), (2,), (2,)]
    tie = choose_open_slot(scores[:2], data([2, 1]), claims, k=2, slots=1)      # wins one, loses one
    assert tie == {"open_slot": True, "open_slot_recall": 0.5, "no_open_slot_recall": 0.5}
    lose = choose_open_slot(scores, data([2, 1, 1]), claims, k=2, slots=1)
    assert lose["open_slot"] is False and lose["no_open_slot_recall"] == pytest.approx(2 / 3)
    # a gold outside the candidates (IGNORE) is a miss either way
    missed = choose_open_slot(scores[:1], data([-100]), claims, k=2, slots=1)
    assert missed == {"open_slot": True, "open_slot_recall": 0.0, "no_open_slot_recall": 0.0}


def test_a_fit_on_one_conversation_serves_the_open_slot_with_nothing_to_compare(tiny_resources):
    # one conversation is one group: no inner fold can be held out, so no training step is scored and the
    # open slot has nothing to lose (a closed loop's first fit without the guard did this and crashed)
    scorer = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=2, head=FAST,
                          query_context=CONTEXT, memory_context=CONTEXT, zero_shot={"guard": False},
                          request={"candidates": 2, "semantic": True, "open_slot": True})
    scorer.fit(HABIT[:1], tiny_resources)
    assert scorer.history["open_slot"] is True
    assert (scorer.history["open_slot_recall"], scorer.history["no_open_slot_recall"]) == (0.0, 0.0)


def test_an_index_saved_before_the_semantic_evidence_loads_without_it(tiny_resources, keyword_embedder,
                                                                     tmp_path):
    # what such an index wrote: a request config without semantic, clause_top or open_slot (the YAML now turns
    # the first and the last on, which its four request features and its model cannot serve)
    res = tiny_resources
    scorer = fitted(res, request={"candidates": 10, "semantic": False, "open_slot": False})
    folder = scorer.save(tmp_path / "idx")
    for meta_path in folder.rglob("meta.json"):
        meta = json.loads(meta_path.read_text())
        if "scorer" in meta:
            meta["scorer"]["request"] = {"candidates": 10, "bm25": {"k1": 1.5, "b": 0.75}}
            meta_path.write_text(json.dumps(meta))
    loaded = type(scorer).load(folder, keyword_embedder, "cpu", verify="none")
    assert loaded.request.config() == {**scorer.request.config(), "clause_top": 2}
    assert loaded.feature_names == scorer.feature_names and loaded.feature_names[-1] == "never_called"
    steps = extract_all(HABIT[:3])
    assert finalize(loaded.score(steps), 3).presented == finalize(scorer.score(steps), 3).presented
