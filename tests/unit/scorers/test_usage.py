"""Usage-enriched tool vectors (:mod:`tracer.scorer_base.usage`): the ``tool2vec`` scorer, and tracer_plus's
zero-shot fusion reading them (``zero_shot.usage``), scored out of fold at fit time and the same live as
batched."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from builders import call, result

from tracer.build import build_scorer
from tracer.core.steps import extract_all
from tracer.core.types import Trajectory
from tracer.encode.index import ToolIndex
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorer_base.usage import check_prior, context_sums, usage_scores, usage_scores_one, usage_vectors
from tracer.scorers.tracer_plus.usage import inner_usage_scores

CONTEXT = {"window": "since_user", "calls": "names", "results": "none"}
FAST = {"inner_folds": 3, "max_epochs": 30, "patience": 10}


def one_call(tid: str, user: str, tool: str) -> Trajectory:
    return Trajectory(id=tid, group=tid, domain="tiny",
                      messages=({"role": "user", "content": user}, call(tool, 0), result(0)))


# a phrasing with no word of any tool (the keyword embedder's "none" axis), always answered by list_files
HABIT = [one_call(f"h{i}", "do the usual", "list_files") for i in range(6)]
# every tool called by exactly one trajectory: out of fold, no tool has the held step's usage
UNIQUE = [one_call("a", "book a flight", "book_flight"), one_call("b", "search flights", "search_flights"),
          one_call("c", "cancel my booking", "cancel_booking"), one_call("d", "weather today", "get_weather"),
          one_call("e", "send an email", "send_email"), one_call("f", "list my files", "list_files")]


def test_usage_vectors_add_the_contexts_that_called_a_tool_to_its_description():
    tools = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])                # [N, d]
    ctx = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.6, 0.8]], dtype=torch.float64)             # [S, d]
    sums = context_sums(ctx, torch.tensor([0, 0]), 3)                                    # both called tool 0
    assert torch.equal(sums, torch.tensor([[0.0, 0.6, 1.8], [0.0] * 3, [0.0] * 3], dtype=torch.float64))
    called, u = usage_vectors(tools, sums.numpy(), 2.0)
    want = np.array([2.0, 0.6, 1.8]) / np.linalg.norm([2.0, 0.6, 1.8])
    assert called.tolist() == [0] and np.allclose(u, [want])
    vec = torch.tensor([[0.5, -0.25, float("-inf")]])                                     # [B, N]
    q = torch.tensor([[0.0, 0.0, 1.0]])
    out = usage_scores(vec, q, called, u)
    assert out[0, 0].item() == pytest.approx(want[2]) and torch.equal(out[0, 1:], vec[0, 1:])  # others kept
    assert np.array_equal(usage_scores_one(vec[0].numpy(), q[0].numpy(), called, u), out[0].numpy())
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="usage prior must be > 0"):
            check_prior(bad, "tool2vec")


def test_tool2vec_without_logs_is_vector_search_and_with_them_learns_the_logs_phrasing(tiny_registry,
                                                                                      keyword_embedder):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    steps = extract_all([one_call("q", "do the usual", "list_files"), *UNIQUE])
    vector, t2v = build_scorer("vector"), build_scorer("tool2vec")
    vector.fit([], res)
    t2v.fit([], res)
    assert torch.equal(t2v.score(steps).fallback, vector.score(steps).fallback)
    t2v.fit(HABIT, res)
    assert t2v.describe()["tools_called"] == 1
    first = finalize(t2v.score(steps), 1).ranking[:, 0].tolist()
    list_files = tiny_registry.id("list_files")
    assert first[0] == list_files != finalize(vector.score(steps), 1).ranking[0, 0].item()
    # the other requests keep their own words' tools: one habit does not take over the registry
    assert first[1:] == finalize(vector.score(steps[1:]), 1).ranking[:, 0].tolist()


def test_the_fit_scores_each_step_with_usage_from_the_other_inner_folds_only(tiny_registry, keyword_embedder):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    for trajs, own in ((UNIQUE, False), (HABIT, True)):
        steps = extract_all(trajs)
        ctx = res.embed(steps, build_scorer("tool2vec").rendering)
        vec = fallback_scores(res, ctx)
        gold = res.tool_ids([s.gold for s in steps])
        out = inner_usage_scores(steps, gold, ctx, ctx, vec, res.tool_index.vectors, 1.0, 3, 0)
        at_gold = out[torch.arange(len(steps)), gold]
        # a tool called once has no usage outside its own fold: the vector score; a habit has it elsewhere
        assert torch.equal(at_gold, vec[torch.arange(len(steps)), gold]) is not own
        if own:
            assert (at_gold > 0.9).all()


@pytest.mark.parametrize("index", ["exact", "hnsw"])
def test_the_fusion_reads_usage_vectors_live_as_batched(tiny_registry, keyword_embedder, index, tmp_path):
    """With the logs' habit, the guard's zero-shot ranking (vector search; usage on) finds list_files out of
    fold on every habit step and is served in the model's place; live and batched present the same tools,
    over an exact and an approximate index, and a saved index keeps the setting."""
    exact = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    ann = ToolIndex(exact.tool_index.names, torch.from_numpy(exact.tool_index.vectors), "HNSW16,Flat",
                    ann_k=3, ef_search=8)
    res = exact if index == "exact" else replace(exact, tool_index=ann)
    steps = extract_all([one_call("q", "do the usual", "list_files"), *UNIQUE])
    zero = {"kind": "vector", "guard": True, "k": 1, "novel": 3, "slots": 1, "toolkit": False, "calls": False,
            "dataflow": False}
    fitted = {}
    for usage in (None, 1.0):
        scorer = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=2, query_context=CONTEXT,
                              memory_context=CONTEXT, head=FAST, zero_shot={**zero, "usage": usage})
        scorer.fit(HABIT + UNIQUE, res)
        fitted[usage] = scorer
        scores = scorer.score(steps)
        presented = finalize(scores, 3, scorer.pad).presented
        mem, q = scorer.embed(steps)
        assert [scorer.select_one(s, (mem[i:i + 1], q[i:i + 1]), 3) for i, s in enumerate(steps)] == presented
        assert [scorer.rank_one(s, (mem[i:i + 1], q[i:i + 1]), 3).tolist() for i, s in enumerate(steps)] == [
            r[:3] for r in finalize(scores, 3, scorer.pad).ranking.tolist()]
        if usage:
            assert tiny_registry.id("list_files") == presented[0][0]
            if index == "exact":
                loaded = type(scorer).load(scorer.save(tmp_path / "usage"), keyword_embedder, "cpu")
                assert loaded.zero.usage == 1.0
                assert finalize(loaded.score(steps), 3, loaded.pad).presented == presented
    assert fitted[1.0].history["guard_zero_shot_recall"] > fitted[None].history["guard_zero_shot_recall"]
    assert fitted[1.0].history["serves"] == "zero_shot"
    with pytest.raises(ValueError, match="zero_shot.usage"):
        build_scorer("tracer_plus", zero_shot={"usage": 0})


def test_an_online_update_rebuilds_the_usage_vectors_as_a_fit_on_the_union_would(tiny_registry,
                                                                                 keyword_embedder):
    """The tries take the logged habit in place; the fusion's usage vectors follow (a new index, new
    vectors), equal to those of a scorer fitted on the union."""
    from tracer.online.incremental import update_scorer

    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    cfg = {"keys": ["prefix"], "vector_candidates": 2, "query_context": CONTEXT, "memory_context": CONTEXT,
           "head": FAST, "zero_shot": {"kind": "vector", "guard": False, "usage": 1.0}}
    live, fresh = build_scorer("tracer_plus", **cfg), build_scorer("tracer_plus", **cfg)
    live.fit(UNIQUE, res)
    before = live.usage.table(live)
    assert tiny_registry.id("list_files") in before[0]
    update_scorer(live, HABIT)
    fresh.fit(UNIQUE + HABIT, res)
    after, want = live.usage.table(live), fresh.usage.table(fresh)
    assert np.array_equal(after[0], want[0]) and np.allclose(after[1], want[1], atol=1e-6)
    row = list(after[0]).index(tiny_registry.id("list_files"))
    assert not np.allclose(after[1][row], before[1][list(before[0]).index(tiny_registry.id("list_files"))])


def test_a_served_tool2vec_learns_new_logs_at_its_refit(tiny_registry, keyword_embedder):
    """Its usage vectors are its learned part: an update holds the new logs, a refit rebuilds the vectors
    from every log held (one assignment), and the habit's phrasing then finds its tool."""
    from tracer import Retriever

    scorer = build_scorer("tool2vec")
    scorer.fit(UNIQUE, Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0))
    r = Retriever(scorer, k=1)
    r.updater.trajectories = list(UNIQUE)
    usual = [{"role": "user", "content": "do the usual"}]
    assert r.rank(usual)[0] != "list_files"
    assert r.update(HABIT)["trajectories"] == len(HABIT) and r.rank(usual)[0] != "list_files"  # not yet
    assert r.updater.refit(wait=True) and r.rank(usual)[0] == "list_files"
    fresh = build_scorer("tool2vec")
    fresh.fit(UNIQUE + HABIT, scorer.res)
    assert all(np.array_equal(a, b) for a, b in zip(scorer.table, fresh.table))


def test_the_fits_inner_usage_vectors_are_the_served_ones_over_the_same_logs(tiny_registry, keyword_embedder):
    """The guard's out-of-fold usage vectors sum the steps' contexts directly (:func:`context_sums`); the
    served ones read the same sums off the index's trie. Over the same steps they are the same vectors."""
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    scorer = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=2, query_context=CONTEXT,
                          memory_context=CONTEXT, head=FAST, zero_shot={"guard": False, "usage": 2.0})
    scorer.fit(HABIT + UNIQUE, res)
    steps = extract_all(HABIT + UNIQUE)
    mem, _ = scorer.embed(steps)
    sums = context_sums(mem, res.tool_ids([s.gold for s in steps]), len(tiny_registry))
    called, u = usage_vectors(res.tool_index.vectors, sums.numpy(), 2.0)
    served = scorer.usage.table(scorer)
    assert np.array_equal(served[0], called) and np.allclose(served[1], u, atol=1e-6)
