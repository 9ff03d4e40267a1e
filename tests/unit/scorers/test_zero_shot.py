"""The zero-shot ranking (``hybrid``: vector and BM25 fused by reciprocal rank) and tracer_plus's guard,
which serves it in the candidate model's place when the inner folds rank it better."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from builders import call, result

from tracer.build import build_scorer
from tracer.core.context import ContextRendering
from tracer.core.steps import extract_all
from tracer.core.types import Registry, Step, Tool, Trajectory
from tracer.encode.index import ToolIndex
from tracer.learn.nll import IGNORE
from tracer.scorer_base.ranking import finalize, reserved
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorers.hybrid import rrf
from tracer.scorers.tracer_plus.features import candidates_one, retrieved_order
from tracer.scorers.tracer_plus.model import save_candidate_model
from tracer.scorers.tracer_plus.zero_shot import (
    ZeroShot,
    rrf_retrieved,
    top_ids,
)

CONTEXT = {"window": "since_user", "calls": "names", "results": "none"}
FAST = {"inner_folds": 3, "max_epochs": 30, "patience": 10}


def one_call(tid: str, user: str, tool: str) -> Trajectory:
    return Trajectory(id=tid, group=tid, domain="tiny",
                      messages=({"role": "user", "content": user}, call(tool, 0), result(0)))


# every tool is called by exactly one trajectory, first: out of fold, no trie ever holds the gold
UNIQUE = [one_call("a", "book a flight", "book_flight"), one_call("b", "search flights", "search_flights"),
          one_call("c", "cancel my booking", "cancel_booking"), one_call("d", "weather today", "get_weather"),
          one_call("e", "send an email", "send_email"), one_call("f", "list my files", "list_files")]


def test_rrf_sums_reciprocal_ranks_with_ties_by_registry_position():
    a = np.array([[3.0, 2.0, 1.0, 0.0]])
    b = np.array([[0.0, 1.0, 2.0, 3.0]])
    assert np.allclose(rrf(a, b, k=0), [[1 + 1 / 4, 1 / 2 + 1 / 3, 1 / 3 + 1 / 2, 1 / 4 + 1]])
    tied = rrf(np.zeros((1, 3)), k=60)                       # all equal: registry order
    assert np.all(np.diff(tied[0]) < 0)


def test_hybrid_scorer_ranks_by_the_fusion_of_vector_and_bm25(tiny_registry, keyword_embedder, tiny_trajs):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    hybrid, vector, bm25 = (build_scorer(n) for n in ("hybrid", "vector", "bm25"))
    for sc in (hybrid, vector, bm25):
        sc.fit([], res)
    steps = extract_all(tiny_trajs)
    expected = rrf(vector.score(steps).fallback.numpy(), bm25.score(steps).fallback.numpy())
    assert np.array_equal(hybrid.score(steps).fallback.numpy(), expected)
    ranking = finalize(hybrid.score(steps), 1).ranking
    assert all(hybrid.rank_one(s, hybrid.embed([s])).tolist() == ranking[i].tolist()
               for i, s in enumerate(steps))


def test_guard_serves_the_model_only_when_it_is_ahead_by_more_than_one_standard_error():
    z = ZeroShot("hybrid", guard=True, k=1)
    inner = torch.tensor([[0.9, 0.1, float("-inf")], [0.2, 0.8, 0.1], [0.5, 0.4, 0.3]])
    gold = torch.tensor([0, 0, IGNORE])                       # hit, miss (0.8 ahead), not a candidate
    tie = z.choose(inner, gold, np.array([True, False, False]))
    assert tie["guard_model_recall"] == pytest.approx(1 / 3) == tie["guard_zero_shot_recall"]
    assert tie["serves"] == "zero_shot"                       # level: the model has not earned its place
    many = torch.tensor([[1.0, 0.0]] * 40)
    clear = z.choose(many, torch.zeros(40, dtype=torch.long), np.zeros(40, bool))
    assert clear["serves"] == "model" and clear["guard_se"] == 0.0
    # 1.0 against 0.75: error sqrt(.1875 / 40) = 0.068
    some = np.arange(40) < 30
    assert z.choose(many, torch.zeros(40, dtype=torch.long), some)["serves"] == "model"
    few = torch.tensor([[1.0, 0.0]] * 4)                      # 0.75 against 0.5 on 4 steps: error 0.33
    assert z.choose(few, torch.tensor([0, 0, 0, 1]), np.arange(4) < 2)["serves"] == "zero_shot"
    # transferred weights: the burden reversed, the zero-shot ranking must lead by more than the error
    assert z.choose(inner, gold, np.array([True, False, False]), transferred=True)["serves"] == "model"
    assert z.choose(few, torch.tensor([0, 0, 0, 1]), np.arange(4) < 2, transferred=True)["serves"] == "model"
    missed = z.choose(few, torch.tensor([1, 1, 1, 1]), np.ones(4, bool), transferred=True)  # 0 against 1
    assert missed["serves"] == "zero_shot"
    assert ZeroShot("hybrid", guard=False).choose(inner, gold, np.ones(3, bool))["serves"] == "model"
    zs = np.array([[0.5, 0.5, 0.1], [0.1, 0.5, 0.5]])
    assert z.hits(zs, np.array([0, 2])).tolist() == [True, False]   # a tie goes to the earlier tool
    with pytest.raises(ValueError, match="zero_shot.kind"):
        ZeroShot("lexical")


def test_tracer_plus_serves_the_zero_shot_ranking_when_its_logs_mislead(tiny_registry, keyword_embedder,
                                                                        tmp_path):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    guarded = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=0, query_context=CONTEXT,
                           memory_context=CONTEXT, head=FAST, request=None,  # the trie's candidates alone
                           zero_shot={"kind": "hybrid", "guard": True, "k": 1})
    guarded.fit(UNIQUE, res)
    assert guarded.history["serves"] == "zero_shot" and guarded.history["guard_model_recall"] == 0.0
    assert guarded.history["guard_zero_shot_recall"] > 0.5
    hybrid = build_scorer("hybrid", context=CONTEXT)
    hybrid.fit([], res)
    steps = extract_all(UNIQUE)
    presented = finalize(guarded.score(steps), 3, guarded.pad).presented
    assert presented == finalize(hybrid.score(steps), 3).presented            # the fused ranking, served
    assert [guarded.select_one(s, guarded.embed([s]), 3) for s in steps] == presented   # live = batched
    guarded.save(tmp_path / "index")
    again = type(guarded).load(tmp_path / "index", keyword_embedder, device="cpu")
    assert again.history["serves"] == "zero_shot"
    assert [again.select_one(s, again.embed([s]), 3) for s in steps] == presented
    unguarded = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=0, query_context=CONTEXT,
                             memory_context=CONTEXT, head=FAST, zero_shot={"kind": "hybrid", "guard": False})
    unguarded.fit(UNIQUE, res)
    assert "serves" not in unguarded.history and not unguarded.zero_shot_only


def test_tracer_plus_without_logs_is_a_cold_index_serving_the_hybrid_ranking(tiny_registry, keyword_embedder):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    cold = build_scorer("tracer_plus", query_context=CONTEXT, memory_context=CONTEXT, head=FAST)
    cold.fit([], res)
    assert cold.cold and cold.zero_shot_only
    hybrid = build_scorer("hybrid", context=CONTEXT)
    hybrid.fit([], res)
    steps = extract_all(UNIQUE)
    assert finalize(cold.score(steps), 3).presented == finalize(hybrid.score(steps), 3).presented
    with pytest.raises(ValueError, match="no training steps"):  # no guard, no transfer: nothing to serve
        build_scorer("tracer_plus", head=FAST, zero_shot={"kind": "vector", "guard": False}).fit([], res)


def test_reserved_gives_the_kth_slot_to_the_first_claimant_not_presented():
    assert reserved((4, 1, 2), (7, 8), 3) == (4, 1, 7)
    assert reserved((4, 1, 2), (1, 8), 3) == (4, 1, 8)         # 1 is presented already: the next claimant
    assert reserved((4, 1, 2), (1, 2), 3) == (4, 1, 2)         # every claimant presented: unchanged
    assert reserved((4, 1, 2), (), 3) == (4, 1, 2)
    assert reserved((4,), (7,), 3) == (4, 7)                   # a short set without padding: appended
    assert reserved((4, 1, 2), (2, 8), 3) == (4, 1, 2)         # a claimant already in the slot keeps it
    # two slots: the first two claimants not presented before them, after what is left of the top
    assert reserved((4, 1, 2, 5, 6), (7, 8), 5, 2) == (4, 1, 2, 7, 8)
    assert reserved((4, 1, 2, 5, 6), (1, 8, 9), 5, 2) == (4, 1, 2, 8, 9)
    assert reserved((4, 1, 2, 5, 6), (8,), 5, 2) == (4, 1, 2, 5, 8)   # one claimant takes one slot
    assert reserved((4, 1, 2, 5, 6), (6, 8), 5, 2) == (4, 1, 2, 6, 8)
    assert reserved((4,), (7, 8), 3, 2) == (4, 7, 8)
    # the first slot is always the ranking's: at most k - 1 reserved slots, none at k = 1, never more than k
    assert reserved((4, 1, 2), (7, 8), 1, 2) == (4, 1, 2)
    assert reserved((4, 1), (7, 8), 2, 2) == (4, 7)
    assert reserved((4,), (7,), 1) == (4,)


# flights only, over and over: the model serves (no guard), and its candidates are the flight tools
FLIGHTS = [one_call(f"f{i}", "book a flight", "book_flight") for i in range(4)] + [
    one_call(f"s{i}", "search flights", "search_flights") for i in range(4)]


@pytest.mark.parametrize("novel, novel_from", [(0, "zero_shot"), (2, "zero_shot"), (2, "vector"),
                                               (2, "hybrid"), (2, "bm25")])
def test_a_never_called_tool_the_zero_shot_ranking_puts_first_takes_the_last_slot(tiny_registry,
                                                                                  keyword_embedder, novel,
                                                                                  novel_from):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    scorer = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=0, query_context=CONTEXT,
                          memory_context=CONTEXT, head=FAST, request=None,  # the trie's candidates alone
                          zero_shot={"kind": "hybrid", "guard": False, "novel": novel,
                                     "novel_from": novel_from})
    scorer.fit(FLIGHTS, res)
    assert not scorer.zero_shot_only
    assert scorer.zero_shot_wanted is (novel_from == "zero_shot" and novel > 0)  # a fusion only if read
    names = tiny_registry.names
    assert [names[t] for t in np.flatnonzero(scorer.never_called)] == [
        "cancel_booking", "get_weather", "send_email", "list_files"]
    steps = extract_all([one_call("t", "list my files", "list_files"), one_call("u", "book a flight",
                                                                                "book_flight")])
    presented = finalize(scorer.score(steps), 2, scorer.pad).presented
    files, flight = [tuple(names[t] for t in p) for p in presented]
    # the trie's two children fill both slots; with novel on, the second goes to list_files (zero-shot first)
    assert files == (("search_flights", "list_files") if novel else ("search_flights", "book_flight"))
    assert flight[0] == "book_flight" and "list_files" not in flight  # zero-shot's top 2 are called tools
    assert [scorer.select_one(s, scorer.embed([s]), 2) for s in steps] == presented        # live = batched
    assert scorer.rank_one(steps[0], scorer.embed([steps[0]]))[0] == names.index("search_flights")


def test_the_novel_slots_read_bm25_only_where_the_request_shares_a_word(tiny_registry, keyword_embedder):
    """``novel_from``: ``bm25`` ranks only the tools sharing a word with the request (a tie at 0 is no
    evidence: no claimant comes of it); ``hybrid`` is the vector and BM25 rankings fused by rank."""
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    rendering = ContextRendering.from_config(CONTEXT)
    steps = extract_all([one_call("t", "list my files", "list_files"),
                         one_call("u", "zzz qqq", "get_weather")])
    vec = np.random.default_rng(0).random((2, len(tiny_registry))).astype(np.float32)       # [B, N]
    lexical = ZeroShot("hybrid")._bm25(res, rendering).step_scores(steps)                   # [B, N]
    assert (lexical[0] > 0).any() and not (lexical[1] > 0).any()
    bm25 = ZeroShot("hybrid", novel=2, novel_from="bm25").novel_scores(steps, vec, None, res, rendering)

    assert np.array_equal(np.isfinite(bm25), lexical > 0)
    assert np.array_equal(bm25[np.isfinite(bm25)], lexical[lexical > 0])
    everyone = np.ones(len(tiny_registry), bool)
    claims = ZeroShot("hybrid", novel=2, novel_from="bm25").reserve(bm25, everyone)
    assert claims[1] == () and claims[0][0] == int(np.argmax(lexical[0]))
    hybrid = ZeroShot("hybrid", novel=2, novel_from="hybrid").novel_scores(steps, vec, None, res, rendering)
    assert np.array_equal(hybrid, rrf(vec, lexical, k=60))
    zs = np.zeros_like(vec)

    def source(novel_from):
        return ZeroShot("hybrid", novel=2, novel_from=novel_from).novel_scores(steps, vec, zs, res, rendering)

    assert source("zero_shot") is zs and source("vector") is vec
    # the request evidence's BM25, where given, is read instead of one computed here
    given = np.zeros_like(lexical)
    given[1, 3] = 2.0
    bm25 = ZeroShot("hybrid", novel=2, novel_from="bm25")
    read = bm25.novel_scores(steps, vec, None, res, rendering, given)                      # [B, N]
    assert np.flatnonzero(np.isfinite(read)).tolist() == [len(tiny_registry) + 3]


def test_the_default_novel_slots_read_the_request_evidences_bm25_not_a_second_pass(tiny_registry,
                                                                                   keyword_embedder,
                                                                                   monkeypatch):
    """With the request evidence on (the default), a step the model serves runs no BM25 of its own for the
    novel slots: the zero-shot BM25 is not built, live or batched, and the slots still claim."""
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    scorer = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=0, query_context=CONTEXT,
                          memory_context=CONTEXT, head=FAST,
                          zero_shot={"kind": "hybrid", "guard": False, "novel": 2, "novel_from": "hybrid"})
    scorer.fit(FLIGHTS, res)
    assert scorer.request is not None and not scorer.zero_shot_wanted

    def second_pass(*_):
        raise AssertionError("the novel slots ran a BM25 of their own")

    monkeypatch.setattr(ZeroShot, "_bm25", second_pass)
    steps = extract_all([one_call("t", "list my files", "list_files")])
    scores = scorer.score(steps)
    assert scores.reserve is not None and scores.reserve[0]
    assert scorer.select_one(steps[0], scorer.embed(steps), 2) == finalize(scores, 2, scorer.pad).presented[0]


def test_top_ids_is_a_stable_argsorts_first_j_ties_by_id():
    rng = np.random.default_rng(0)
    for _ in range(500):
        n, j = int(rng.integers(1, 30)), int(rng.integers(0, 8))
        s = rng.integers(0, 5, n).astype(np.float32)  # many ties
        s[rng.random(n) < rng.random()] = -np.inf      # tools an approximate index did not retrieve
        assert top_ids(s, j).tolist() == np.argsort(-s, kind="stable")[:j].tolist()


def test_rrf_over_an_approximate_index_fuses_the_retrieved_and_the_lexical_leaders_only():
    inf = -np.inf
    vec = np.array([[0.9, inf, 0.5, 0.9, inf, inf]])         # retrieved: 0 and 3 tie (by id), then 2
    lex = np.array([[0.0, 2.0, 0.0, 1.0, 3.0, 0.5]])         # lexical top 3 with a positive score: 4, 1, 3
    got = rrf_retrieved(vec, lex, k=0, t=3)
    want = np.array([[1.0, 1 / 2, 1 / 3, 1 / 2 + 1 / 3, 1.0, inf]], dtype=np.float32)
    assert np.array_equal(got, want) and got.dtype == np.float32
    assert np.isneginf(rrf_retrieved(np.full((1, 3), inf), np.zeros((1, 3)), k=60, t=2)).all()
    # no lexical ranking: the retrieved tools alone, by rank
    alone = np.array([[1.0, inf, 1 / 3, 1 / 2, inf, inf]], dtype=np.float32)
    assert np.array_equal(rrf_retrieved(vec, None, k=0, t=3), alone)


def test_a_cold_index_over_hnsw_presents_from_the_fused_tools_live_as_batched(tiny_registry,
                                                                             keyword_embedder):
    """A cold tracer_plus over an approximate index serves the fusion of what the index retrieved and BM25's
    leaders (2 + 2 of the 6 tools at most; nothing sorts the registry live) and the live step presents as the
    batched one, padded by registry position where fewer than k are ranked."""
    exact = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    ann = ToolIndex(exact.tool_index.names, torch.from_numpy(exact.tool_index.vectors), "HNSW16,Flat",
                    ann_k=2, ef_search=8)
    res = replace(exact, tool_index=ann)
    cold = build_scorer("tracer_plus", query_context=CONTEXT, memory_context=CONTEXT, head=FAST)
    cold.fit([], res)
    steps = extract_all(UNIQUE)
    scores = cold.score(steps)
    finite = torch.isfinite(scores.fallback).sum(1)
    assert cold.zero_shot_only and (finite >= 2).all() and (finite <= 4).all() and (finite < 3).any()
    presented = finalize(scores, 3).presented
    contexts = cold.embed(steps)
    for i, step in enumerate(steps):
        assert cold.select_one(step, tuple(c[i:i + 1] for c in contexts), 3) == presented[i], i


def test_transferred_weights_face_the_guard_too(tiny_registry, keyword_embedder, tmp_path):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    habit = [one_call(f"h{i}", "do the usual", "list_files") for i in range(6)]  # no word of the tool's
    plain = {"keys": ["prefix"], "vector_candidates": 0, "query_context": CONTEXT, "memory_context": CONTEXT,
             "head": FAST, "request": None}  # the trie's candidates alone
    trained = build_scorer("tracer_plus", **plain, zero_shot={"kind": "hybrid", "guard": False})
    trained.fit(habit, res)
    path = save_candidate_model(trained.model, trained.feature_names, tmp_path / "model.pt")

    def transfer(trajectories):
        sc = build_scorer("tracer_plus", **plain, transfer=str(path),
                          zero_shot={"kind": "hybrid", "guard": True, "k": 1})
        sc.fit(trajectories, res)
        return sc

    assert transfer(habit).history["serves"] == "model"       # out of fold the trie knows the habit
    unique = transfer(UNIQUE)                                  # out of fold no trie holds the gold
    assert unique.history["serves"] == "zero_shot" and unique.zero_shot_only and not unique.cold
    assert unique.learned_part == "model"                      # a refit asks the guard again
    cold = transfer([])
    assert cold.cold and "serves" not in cold.history


def test_two_novel_slots_take_the_last_two_places_live_as_batched(tiny_registry, keyword_embedder):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    scorer = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=0, query_context=CONTEXT,
                          memory_context=CONTEXT, head=FAST,
                          zero_shot={"kind": "hybrid", "guard": False, "novel": 6, "slots": 2})
    scorer.fit(FLIGHTS, res)
    never = set(np.flatnonzero(scorer.never_called).tolist())
    steps = extract_all(UNIQUE)
    scores = scorer.score(steps)
    presented = finalize(scores, 3, scorer.pad).presented
    for row, claims, ranked in zip(presented, scores.reserve, finalize(scores, 3).ranking.tolist()):
        # the model's first, then the first two claimants
        assert len(claims) >= 2 and set(row[1:]) <= never and row[0] == ranked[0]
        assert list(row[1:]) == [c for c in claims if c != row[0]][:2]
    contexts = scorer.embed(steps)
    live = [scorer.select_one(s, tuple(c[i:i + 1] for c in contexts), 3) for i, s in enumerate(steps)]
    assert live == presented
    with pytest.raises(ValueError, match="zero_shot.slots"):
        ZeroShot("hybrid", novel=2, slots=0)
    with pytest.raises(ValueError, match="zero_shot.novel_from"):
        ZeroShot("hybrid", novel=2, novel_from="lexical")


def test_a_never_called_tool_of_the_toolkit_in_use_claims_from_the_wider_top():
    """``novel_toolkit``: past the top ``novel``, a never-called tool claims only where it belongs to the
    toolkit of the step's last call the registry knows, and that toolkit's claimants come first; a tool of
    another toolkit, a step with no known last call and a toolkit holding the whole registry (no evidence)
    keep the top ``novel`` alone."""
    tools = [Tool("cd", source="fs"), Tool("ls", source="fs"), Tool("rm", source="fs"),
             Tool("send", source="mail"), Tool("read", source="mail"), Tool("add", source="math")]
    registry = Registry(tools)
    never = np.array([False, True, True, True, True, True])           # only cd was ever called
    # each step ranks: add, send, cd, ls, read, rm (ties none), then nothing
    row = np.array([3.0, 2.0, 0.5, 4.0, 1.0, 5.0], dtype=np.float32)

    def step(history):
        return Step("t", "t", 0, len(history), tuple(history), tuple(history), "ls", ())

    steps = [step(["cd"]), step(["send"]), step([]), step(["unknown", "cd"])]
    zs = np.tile(row, (len(steps), 1))                                                   # [B, N]
    wide = ZeroShot("hybrid", novel=2, novel_toolkit=5)
    assert wide.reserve(zs, never, steps, registry) == [
        (1, 5, 3),  # ls first (fs is the last call's toolkit; rm is 6th), then add and send, the top 2
        (3, 4, 5),  # after send: mail's, send and read, then add
        (5, 3),     # no call yet: the top 2 alone
        (1, 5, 3),  # the last call the registry knows: cd
    ]
    assert ZeroShot("hybrid", novel=2).reserve(zs, never, steps, registry) == [(5, 3)] * 4
    assert wide.reserve(zs, never) == [(5, 3)] * 4                                      # no steps: top 2
    assert wide.reserve(zs, never, steps) == [(5, 3)] * 4                               # no registry
    same = Registry([replace(t, source="all") for t in tools])                          # one toolkit: none
    assert wide.reserve(zs, never, steps, same) == [(5, 3)] * 4
    with pytest.raises(ValueError, match="zero_shot.novel_toolkit"):
        ZeroShot("hybrid", novel=2, novel_toolkit=-1)


@pytest.mark.parametrize("index", ["exact", "hnsw"])
def test_the_fusion_joins_the_candidates_live_as_batched(tiny_registry, keyword_embedder, index, tmp_path):
    """``zero_shot.candidates``: the fusion's top m join the candidates, with three features of their own.
    Vector search's top 2 for "what is the forecast" misses get_weather, BM25 ("forecast") ranks it second.
    The live rows equal the batched ones bit for bit, over an exact and an approximate index."""
    exact = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    ann = ToolIndex(exact.tool_index.names, torch.from_numpy(exact.tool_index.vectors), "HNSW16,Flat",
                    ann_k=3, ef_search=8)
    res = exact if index == "exact" else replace(exact, tool_index=ann)
    steps = extract_all([one_call("g", "what is the forecast", "get_weather"), *UNIQUE])
    covered = {}
    for candidates in (False, True):
        scorer = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=2, query_context=CONTEXT,
                              memory_context=CONTEXT, head=FAST, request=None,  # the fusion's alone
                              zero_shot={"kind": "hybrid", "guard": False, "candidates": candidates})
        scorer.fit(FLIGHTS, res)
        assert not scorer.zero_shot_only and scorer.config()["zero_shot"]["candidates"] is candidates
        scores = scorer.score(steps)
        covered[candidates] = scores.diagnostics["in_candidates"][0].item()
        mem, q = scorer.embed(steps)
        vec = fallback_scores(res, q)                                                     # [B, N]
        zs = torch.from_numpy(scorer.zero.scores(steps, vec.numpy(), res, scorer.query_rendering))
        batch = scorer.candidates(steps, mem, vec, zs if candidates else None)
        assert batch.feats.shape[2] == len(scorer.feature_names) == 14 + 8 + 3 * candidates  # key, all, zs
        for i, step in enumerate(steps):  # the live rows, bit for bit
            one = candidates_one(scorer.index, step, mem[i].numpy(), vec[i].numpy(), 2,
                                 None if res.tool_index.exact else retrieved_order(vec[i].numpy()),
                                 zs[i].numpy() if candidates else None)
            width = len(one.tool)
            assert batch.tool[i, :width].tolist() == one.tool.tolist() and not batch.mask[i, width:].any()
            assert torch.equal(batch.feats[i, :width], torch.from_numpy(one.feats)), (candidates, i)
        presented = finalize(scores, 3, scorer.pad).presented
        assert [scorer.select_one(s, (mem[i:i + 1], q[i:i + 1]), 3) for i, s in enumerate(steps)] == presented
        if index == "exact":  # a saved index keeps the setting and the fusion's features
            loaded = type(scorer).load(scorer.save(tmp_path / str(candidates)), keyword_embedder, "cpu")
            assert loaded.feature_names == scorer.feature_names
            assert finalize(loaded.score(steps), 3, loaded.pad).presented == presented
    assert covered == {False: 0.0, True: 1.0}
    with pytest.raises(TypeError, match="zero_shot.candidates must be a bool"):
        ZeroShot("hybrid", candidates="yes")
