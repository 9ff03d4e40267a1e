"""The tracer_plus unit tests' fitted hand corpus (tests/plus_hand.py)."""

from __future__ import annotations

import pytest
from plus_hand import HAND_TEST, HAND_TRAIN, USER_ONLY, plus

from tracer.core.steps import extract_steps
from tracer.scorer_base.resources import Resources


@pytest.fixture
def hand(tiny_registry, keyword_embedder):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    scorer = plus(res, keys=["prefix", "last_1+cross_turn"], vector_candidates=3, query_context=USER_ONLY,
                  memory_context=USER_ONLY)
    scorer.fit(HAND_TRAIN, res)
    step = extract_steps(HAND_TEST)[1]
    assert step.prefix == () and step.history == ("get_weather",) and step.gold == "send_email"
    return scorer, step
