"""The conversation's own signals in tracer_plus's zero-shot ranking: the toolkit of its last call and the
turn's previous call (``zero_shot.toolkit``, ``zero_shot.calls``), batched, live and saved."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from builders import TINY_TOOLS
from plus_hand import cold_pair, live_and_saved, traj

from tracer.core.steps import extract_all
from tracer.core.types import Registry, Step, Tool
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorers.hybrid import rrf
from tracer.scorers.tracer_plus.zero_shot import ZeroShot, second_place, toolkit_rrf, toolkits

CONTEXT = {"window": "since_user", "calls": "names", "results": "none"}


def test_toolkit_rrf_ranks_the_toolkit_of_the_last_known_call_by_vector_score():
    registry = Registry([Tool("a", source="x"), Tool("b", source="x"), Tool("c", source="y"),
                         Tool("d", source="x"), Tool("e")])
    vec = np.tile(np.array([0.1, 0.5, 0.9, -np.inf, 0.3]), (5, 1))   # d: not retrieved, so not ranked
    histories = [("c", "a", "not_in_registry"), ("c",), ("e",), (), ("a", "b")]
    steps = [Step("t", "t", 0, 0, (), h, "a", ()) for h in histories]
    got = toolkit_rrf(steps, vec, registry, toolkits(registry), k=0)
    assert got.dtype == np.float32
    assert got.tolist() == [[0.5, 1.0, 0, 0, 0],     # the last call the registry knows is a: x's b, then a
                            [0, 0, 1.0, 0, 0],       # y holds c alone
                            [0] * 5, [0] * 5,        # an unnamed toolkit, no call yet: no ranking
                            [0.5, 1.0, 0, 0, 0]]
    one = Registry([Tool("a", source="app"), Tool("b", source="app")])  # one toolkit of every tool: no signal
    assert toolkits(one) == {} and not toolkit_rrf(steps[:1], vec[:1, :2], one, toolkits(one), k=0).any()
    with pytest.raises(TypeError, match="toolkit must be a bool"):
        ZeroShot("hybrid", toolkit="yes")


def test_a_cold_index_fuses_the_last_calls_toolkit_live_as_batched_and_keeps_it_on_disk(
        keyword_embedder, tmp_path):
    kits = {"search_flights": "travel", "book_flight": "travel", "cancel_booking": "travel",
            "get_weather": "weather", "send_email": "mail", "list_files": "files"}
    registry = Registry([replace(t, source=kits[t.name]) for t in TINY_TOOLS])
    res = Resources.build(registry, keyword_embedder, device="cpu", seed=0)
    on, off = cold_pair(res, CONTEXT, *({"kind": "hybrid", "guard": True, "toolkit": t}
                                        for t in (True, False)))
    steps = extract_all([traj("t", ("send the weather by email", ("cancel_booking", "book_flight")))])
    vec = fallback_scores(res, on.embed(steps)[1]).numpy()                             # [B, N]
    want = off.score(steps).fallback.numpy() + toolkit_rrf(steps, vec, registry, toolkits(registry), 60)
    assert np.array_equal(on.score(steps).fallback.numpy(), want)
    on_presented, off_presented = (finalize(sc.score(steps), 2).presented for sc in (on, off))
    assert on_presented[0] == off_presented[0]                     # the first call: no toolkit yet
    # after cancel_booking the travel toolkit's book_flight takes send_email's place
    book, email = registry.id("book_flight"), registry.id("send_email")
    assert on_presented[1] == (registry.id("cancel_booking"), book) and email in off_presented[1]
    live, loaded, reloaded = live_and_saved(on, steps, 2, tmp_path / "index", keyword_embedder)
    assert live == on_presented == reloaded and loaded.zero.toolkit


def test_second_place_moves_the_turns_previous_call_up_to_second_never_first():
    registry = Registry([Tool(n) for n in "abcde"])
    scores = np.tile(np.array([0.5, 0.4, 0.3, 0.2, 0.1], np.float32), (6, 1))
    vec = np.tile(np.array([0.9, 0.8, 0.7, 0.6, 0.5]), (6, 1))
    vec[5, 3] = -np.inf                                  # d removed from the index in the last step
    cases = [(("a", "d"), ("c", "a", "d")),  # the turn's last call, d, not the earlier a: to second place
             (("a",), ("a",)),               # first already: unchanged
             (("b",), ("b",)),               # second already: unchanged
             ((), ("d",)),                   # a step opening its turn: earlier turns' calls are not moved
             (("gone",), ("gone",)),         # a call the registry does not know
             (("d",), ("d",))]               # a call with no finite vector score
    steps = [Step("t", "t", 0, len(p), p, h, "a", ()) for p, h in cases]
    got = second_place(scores, steps, vec, registry)
    assert got.dtype == np.float32 and np.array_equal(np.delete(got[0], 3), np.delete(scores[0], 3))
    assert got[0, 1] < got[0, 3] < got[0, 0] and got[0, 3] == np.nextafter(np.float32(0.4), np.float32(1))
    assert np.array_equal(got[1:], scores[1:])
    with pytest.raises(TypeError, match="calls must be a bool"):
        ZeroShot("vector", calls=1)


@pytest.mark.parametrize("kind", ["vector", "hybrid"])
def test_a_cold_index_proposes_the_turns_last_call_live_as_batched_and_keeps_it_on_disk(
        kind, tiny_registry, keyword_embedder, tmp_path):
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)
    blind = {**CONTEXT, "calls": "none"}  # the query does not name the calls: the ranking alone proposes them
    on, off = cold_pair(res, blind, *({"kind": kind, "guard": True, "calls": c} for c in (True, False)))
    # the weather of two cities
    steps = extract_all([traj("t", ("send an email about flights", ("get_weather", "get_weather")))])
    vec = fallback_scores(res, on.embed(steps)[1]).numpy()                             # [B, N]
    plain = rrf(vec, k=60) if kind == "vector" else off.score(steps).fallback.numpy()
    assert np.array_equal(on.score(steps).fallback.numpy(), second_place(plain, steps, vec, tiny_registry))
    weather = tiny_registry.id("get_weather")
    on_presented, off_presented = (finalize(sc.score(steps), 2).presented for sc in (on, off))
    assert on_presented[0] == off_presented[0] and weather not in on_presented[0]  # no call yet
    assert on_presented[1] == (off_presented[1][0], weather) and weather not in off_presented[1]  # second
    live, loaded, reloaded = live_and_saved(on, steps, 2, tmp_path / "index", keyword_embedder)
    assert live == on_presented == reloaded and loaded.zero.calls
