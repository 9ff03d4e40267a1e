"""Hand-computed checks of the literature baselines: ToolNet, AutoTool and H-EPM (Insight: test_insight.py).

The tiny corpus (``tests/builders.py``) has these cross-turn transitions, all successful
(START = the first call of a conversation; lengths in calls in brackets):

    t0 [2]: START -> search_flights -> book_flight
    t1 [3]: START -> search_flights -> book_flight -> cancel_booking   (the last call opens turn 2)
    t2 [2]: START -> get_weather -> send_email
    t3 [2]: START -> search_flights -> get_weather                     (turn 2)
    t4 [1]: START -> list_files

The keyword embedder maps a text to the normalised indicator of the keywords it holds among
flight, book, cancel, weather, email, file; so the tools embed as
search_flights = e_flight, book_flight = (e_flight + e_book)/sqrt2, cancel_booking =
(e_cancel + e_book)/sqrt2, get_weather = e_weather, send_email = e_email, list_files = e_file."""

from __future__ import annotations

import math

import pytest
import torch
from builders import FakeModel, fitted_scorer, names, step, traj

from tracer.build import build_scorer
from tracer.core.steps import extract_steps
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources
from tracer.scorers.summaries import call_outcomes, digest

R2 = 1 / math.sqrt(2)


# ---- ToolNet -----------------------------------------------------------------------------------------------
def test_toolnet_successors_and_weights(tiny_trajs, tiny_resources):
    sc = build_scorer("toolnet")
    sc.fit(tiny_trajs, tiny_resources)
    assert sc.successors(None) == pytest.approx({"search_flights": 3 / 5, "get_weather": 1 / 5,
                                                 "list_files": 1 / 5})
    assert sc.successors("search_flights") == pytest.approx({"book_flight": 2 / 3, "get_weather": 1 / 3})
    assert sc.successors("book_flight") == {"cancel_booking": 1.0}
    assert sc.successors("send_email") == {}


def test_toolnet_presents_successors_then_pads_or_falls_back(tiny_trajs, tiny_resources, tiny_registry):
    sc = build_scorer("toolnet")
    sc.fit(tiny_trajs, tiny_resources)
    steps = [step((), "hello"), step(("search_flights",), "hello", 1), step(("send_email",), "weather", 1)]
    s = sc.score(steps)
    assert (s.diagnostics["in_trie"].tolist() == [True, True, False]
            and s.fell_back.tolist() == [False, False, True])
    assert torch.allclose(s.primary[1, [1, 3]], torch.tensor([2 / 3, 1 / 3]))
    padded, bare = finalize(s, 3, pad=True), finalize(s, 3, pad=False)
    # START: search_flights, then the tie get_weather = list_files (1/5) broken by the fallback ("hello"
    # matches no tool, cosine 0 with all) and then registry order.
    assert names(tiny_registry, padded.presented[0]) == ["search_flights", "get_weather", "list_files"]
    # 2 successors, no padding
    assert names(tiny_registry, bare.presented[1]) == ["book_flight", "get_weather"]
    assert names(tiny_registry, padded.presented[1])[:2] == ["book_flight", "get_weather"]
    assert len(padded.presented[1]) == 3
    # send_email has no successor: vector ranking, "weather" -> get_weather first.
    assert names(tiny_registry, padded.presented[2])[0] == "get_weather"
    assert len(bare.presented[2]) == 3


# ---- AutoTool ----------------------------------------------------------------------------------------------
def test_autotool_blend_at_alpha_half(tiny_trajs, tiny_resources, tiny_registry):
    sc = build_scorer("autotool")
    sc.fit(tiny_trajs, tiny_resources)
    assert sc.alpha == 0.5
    steps = [
        # state (search_flights, book_flight) seen once, -> cancel_booking; context e(weather, email)
        step(("search_flights", "book_flight"), "weather and email", 2),
        # state (get_weather, search_flights) unseen -> back off to (search_flights,): book 2/3, weather 1/3
        step(("get_weather", "search_flights"), "cancel", 2),
        # list_files has no successor at any level: similarity only
        step(("list_files",), "weather", 1),
    ]
    s = sc.score(steps)
    #            search  book           cancel         weather        email          files
    expected = torch.tensor([
        [0.0, 0.0, 0.5 * 1 + 0.0, 0.5 * R2, 0.5 * R2, 0.0],
        [0.0, 0.5 * 2 / 3 + 0.0, 0.0 + 0.5 * R2, 0.5 * 1 / 3, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.5 * 1.0, 0.0, 0.0],
    ])
    assert torch.allclose(s.primary, expected, atol=1e-6)
    assert s.diagnostics["backoff"].tolist() == [2, 1, -1]
    assert (s.diagnostics["in_trie"].tolist() == [True, False, False]
            and s.fell_back.tolist() == [False, False, True])
    ranking = finalize(s, 3).ranking
    assert names(tiny_registry, ranking[0, :3]) == ["cancel_booking", "get_weather", "send_email"]
    # the similarity of "cancel" to cancel_booking (0.354) beats book_flight's inertia (0.333)
    assert names(tiny_registry, ranking[1, :3]) == ["cancel_booking", "book_flight", "get_weather"]
    assert names(tiny_registry, ranking[2, :1]) == ["get_weather"]


# ---- H-EPM -------------------------------------------------------------------------------------------------
def test_hepm_weights_reduce_to_normalised_counts_at_c0(tiny_trajs, tiny_resources):
    sc = build_scorer("hepm", c=0.0)
    sc.fit(tiny_trajs, tiny_resources)
    assert sc.weights(None) == pytest.approx({"search_flights": 3 / 5, "get_weather": 1 / 5,
                                              "list_files": 1 / 5})
    assert sc.weights("search_flights") == pytest.approx({"book_flight": 2 / 3, "get_weather": 1 / 3})


def test_hepm_efficiency_weights(tiny_trajs, tiny_resources):
    sc = build_scorer("hepm", c=1.0)
    sc.fit(tiny_trajs, tiny_resources)
    # START: search_flights 3 + (1/2 + 1/3 + 1/2) = 13/3; get_weather 1 + 1/2 = 3/2; list_files 1 + 1/1 = 2;
    # total 47/6.
    assert sc.weights(None) == pytest.approx({"search_flights": 26 / 47, "get_weather": 9 / 47,
                                              "list_files": 12 / 47})
    # search_flights: book_flight 2 + (1/2 + 1/3) = 17/6; get_weather 1 + 1/2 = 9/6.
    assert sc.weights("search_flights") == pytest.approx({"book_flight": 17 / 26, "get_weather": 9 / 26})


def test_hepm_counts_each_trajectory_once_and_ignores_failures(tiny_resources):
    trajs = [traj("a", "weather", ["get_weather", "get_weather", "get_weather"]),    # gw->gw twice, n = 3
             traj("b", "weather", ["get_weather", "send_email"]),                    # gw->se once, n = 2
             traj("c", "weather", ["get_weather", "list_files"], success=False)]     # not counted
    sc = build_scorer("hepm", c=2.0)
    sc.fit(trajs, tiny_resources)
    # gw->gw: 2 + 2 * 1/3 = 8/3; gw->se: 1 + 2 * 1/2 = 2; total 14/3.
    assert sc.weights("get_weather") == pytest.approx({"get_weather": 8 / 14, "send_email": 6 / 14})


def test_hepm_annotation_branch_and_suggestion(tiny_trajs, tiny_resources, tiny_registry):
    q = [step((), "What's the weather in Rome")]
    by_weight = fitted_scorer(build_scorer("hepm", policy="never"), tiny_trajs, tiny_resources).score(q)
    recalled = fitted_scorer(build_scorer("hepm", policy="always"), tiny_trajs, tiny_resources).score(q)
    # never: START successors by weight: search_flights 26/47, list_files 12/47, get_weather 9/47.
    assert names(tiny_registry, finalize(by_weight, 2).ranking[0, :3]) == ["search_flights", "list_files",
                                                                           "get_weather"]
    # always: the digest "request: What's the weather in Rome / calls: none" embeds as e_weather; the
    # annotations of START->get_weather (t2: weather, email) give cos 1/sqrt2, the others 0.
    assert recalled.primary[0].tolist() == pytest.approx([0.0, -math.inf, -math.inf, R2, -math.inf, 0.0])
    assert names(tiny_registry, finalize(recalled, 2).ranking[0, :3]) == ["get_weather", "search_flights",
                                                                          "list_files"]
    assert recalled.present_all and finalize(recalled, 1).presented[0] == tuple(range(len(tiny_registry)))
    line = recalled.guidance[0]
    assert line.endswith("get_weather, search_flights") and "offline digest" in line and "always" in line
    assert (recalled.diagnostics["summarised"].tolist() == [True]
            and by_weight.diagnostics["summarised"].tolist() == [False])
    assert recalled.diagnostics["guidance_chars"].tolist() == [len(line)]


def test_hepm_turn_start_rule_and_no_successors(tiny_trajs, tiny_resources):
    sc = build_scorer("hepm", policy={"rule": "turn_start"})
    sc.fit(tiny_trajs, tiny_resources)
    s = sc.score([step((), "weather"), step(("search_flights",), "weather", 1),
                  step(("send_email",), "x", 1)])
    assert s.diagnostics["summarised"].tolist() == [True, False, False]
    assert (s.fell_back.tolist() == [False, False, True]
            and s.diagnostics["in_trie"].tolist() == [True, True, False])
    assert s.guidance[2] == ""
    assert sc.describe()["policy"] == "turn_start" and sc.describe()["summaries"].startswith("offline digest")
    assert sc.model_calls == 0


def test_hepm_with_a_model_counts_its_calls(tiny_trajs, tiny_registry, keyword_embedder):
    model = FakeModel()
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0, executor=model)
    sc = build_scorer("hepm")
    sc.fit(tiny_trajs, res)
    assert sc.fit_model_calls == model.calls > 0
    s = sc.score([step((), "weather"), step(("search_flights",), "flight", 1)])
    assert sc.model_calls == model.calls == sc.fit_model_calls + 2   # one decide-and-summarise call per step
    # the model answered SKIP to the second
    assert s.diagnostics["summarised"].tolist() == [True, False]
    assert "model summaries (fake)" in s.guidance[0] and sc.describe()["policy"] == "model decides"


def test_offline_digest_lists_request_calls_and_outcomes():
    t = traj("d", "weather please", ["get_weather", "send_email"], results=["sunny", "Error: no recipient"])
    assert call_outcomes(t.messages) == [("get_weather", "ok"), ("send_email", "error")]
    assert digest(t.messages) == "request: weather please\ncalls: get_weather [ok]; send_email [error]"
    assert digest(extract_steps(t)[1].context) == "request: weather please\ncalls: get_weather [ok]"
