"""tracer_plus's state gate (``zero_shot.gate``): where the model serves, a step whose state no log holds is
ranked by the zero-shot fusion, and the guard judges the model as it serves."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from builders import call, result, tiny_trajectories
from plus_hand import FAST

from tracer.build import build_scorer
from tracer.core.steps import step_from_messages
from tracer.learn.nll import IGNORE
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import fallback_scores
from tracer.scorer_base.trial import EXPLORED
from tracer.scorers.tracer_plus.zero_shot import ZeroShot

CONTEXT = {"window": "since_user", "calls": "names", "results": "none"}


def plus(res, gate: bool, own: bool = True):
    """tracer_plus fitted on the tiny logs, marked as a gateway's trial conversations when ``own``."""
    scorer = build_scorer("tracer_plus", keys=["prefix"], vector_candidates=2, head=FAST,
                          query_context=CONTEXT, memory_context=CONTEXT, request=None,
                          zero_shot={"kind": "hybrid", "guard": False, "novel": 0, "gate": gate,
                                     "trial": 0.1})
    logs = [replace(t, metadata={EXPLORED: True}) if own else t for t in tiny_trajectories()]
    scorer.fit(logs, res)
    return scorer


def test_a_step_the_logs_never_reached_is_ranked_by_the_fusion(tiny_resources):
    gated, plain = plus(tiny_resources, True), plus(tiny_resources, False)
    known = step_from_messages([{"role": "user", "content": "Find a flight to Rome and book it"},
                                call("search_flights", 0), result(0)])       # (search_flights,): logged
    unknown = step_from_messages([{"role": "user", "content": "Show the files and book a flight"},
                                  call("list_files", 0), result(0)])         # (list_files,): no logged child
    steps = [known, unknown]
    mem, query = gated.embed(steps)
    assert gated.candidates(steps, mem, fallback_scores(tiny_resources, query)).in_state[:, 0].tolist() == [
        True, False]
    rank_gated = finalize(gated.score(steps), 5).ranking
    assert torch.equal(rank_gated[0], finalize(plain.score(steps), 5).ranking[0])   # the model, as ungated
    fusion = finalize(gated.score_embedded(steps, *gated.embed(steps), serving="zero_shot"), 5).ranking
    assert torch.equal(rank_gated[1], fusion[1])                                   # the fusion's ranking
    assert not torch.equal(rank_gated[1], finalize(plain.score(steps), 5).ranking[1])
    assert gated.score(steps).fell_back.tolist() == [False, True]
    assert gated.gates and gated.history["own_logs"] is True and not plain.gates
    # the live step gates the same steps: presented sets and rankings equal the batched ones
    batched = finalize(gated.score(steps), 5)
    for i, s in enumerate(steps):
        assert gated.select_one(s, gated.embed([s]), 5) == batched.presented[i]
        assert gated.rank_one(s, gated.embed([s])).tolist() == batched.ranking[i].tolist()
    # the same model fitted on complete logs of another system (no trial in them) is not gated
    other = plus(tiny_resources, True, own=False)
    assert not other.gates and torch.equal(finalize(other.score(steps), 5).ranking,
                                           finalize(plain.score(steps), 5).ranking)


def test_the_guard_judges_the_gated_model_as_it_serves():
    z = ZeroShot("hybrid", guard=True, k=1, gate=True)
    inner = torch.tensor([[1.0, 0.0]] * 4)                    # the model ranks candidate 0 first everywhere
    gold = torch.tensor([0, 0, 1, IGNORE])                    # hit, hit, miss, not a candidate
    zero_hits = np.array([False, True, True, True])
    state = torch.tensor([True, True, False, False])          # the last two: the logs never reached them
    gated = z.choose(inner, gold, zero_hits, state=state)
    # the model's hits 1, 1, then the fusion's 1, 1 where it does not serve: 4 of 4 against 3 of 4
    assert gated["guard_model_recall"] == 1.0 and gated["guard_zero_shot_recall"] == 0.75
    ungated = ZeroShot("hybrid", guard=True, k=1).choose(inner, gold, zero_hits, state=state)
    assert ungated["guard_model_recall"] == 0.5
    with pytest.raises(TypeError, match="zero_shot.gate"):
        ZeroShot("hybrid", gate="yes")
