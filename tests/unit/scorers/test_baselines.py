"""Hand-computed checks of the literature baselines: ToolNet, AutoTool, H-EPM and Insight.

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
(e_cancel + e_book)/sqrt2, get_weather = e_weather, send_email = e_email, list_files = e_file.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from builders import fitted_scorer

from tracer.build import build_insight_memory, build_scorer
from tracer.core.steps import extract_steps
from tracer.core.types import Step, Trajectory
from tracer.scorers.insight import candidate_ks, select_k
from tracer.scorers.summaries import call_outcomes, digest
from tracer.scoring.ranking import finalize
from tracer.scoring.resources import Resources

R2 = 1 / math.sqrt(2)


def step(history: tuple[str, ...], user: str, position: int = 0) -> Step:
    """A step whose context is one user message (the calls of ``history`` are not in the context)."""
    return Step(trajectory_id="q", group="q", turn=0, position=position,
                prefix=history[len(history) - position:], history=history, gold="",
                context=({"role": "user", "content": user},))


def traj(tid: str, user: str, calls: list[str], success: bool = True,
         results: list[str] | None = None) -> Trajectory:
    msgs: list[dict] = [{"role": "user", "content": user}]
    for i, name in enumerate(calls):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps({})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": (results or ["ok"] * len(calls))[i]})
    return Trajectory(id=tid, group=tid, domain="tiny", messages=tuple(msgs), success=success,
                      reward=1.0 if success else 0.0)


def names(registry, ids) -> list[str]:
    return [registry[i].name for i in ids]


class FakeModel:
    """A deterministic executor that writes text, counts its calls and calls every non-weather step
    routine."""

    name = "fake"
    is_oracle = False
    tokenizer_name = None
    lesson = "Do check the weather first; avoid emailing without a recipient."

    def __init__(self):
        self.calls = 0

    def complete(self, messages) -> str:
        self.calls += 1
        prompt = messages[-1]["content"]
        if "routine" in prompt and "weather" not in prompt:
            return "SKIP"
        if "past episodes" in prompt:
            return self.lesson
        return "The user wants the weather."


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


# ---- Insight -----------------------------------------------------------------------------------------------
def test_insight_k_grid():
    assert candidate_ks() == [5, 15, 26, 36, 46, 57, 67, 78, 88, 98, 109, 119, 129, 140, 150]


def test_insight_selects_k_by_silhouette_on_a_mixture():
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    rng = np.random.default_rng(0)
    centers = rng.normal(0, 10, size=(15, 16))
    x = np.concatenate([c + rng.normal(0, 0.3, size=(10, 16)) for c in centers])    # 150 points, true K = 15
    k, labels, scores = select_k(x, seed=0)
    valid = [c for c in candidate_ks() if c < len(x) / 3]                               # 5, 15, 26, 36, 46
    assert sorted(scores) == valid == [5, 15, 26, 36, 46]
    reference = {c: silhouette_score(x, KMeans(n_clusters=c, random_state=0, n_init="auto").fit_predict(x))
                 for c in valid}
    assert scores == pytest.approx(reference)
    assert k == max(reference, key=reference.get) == 15
    assert len(set(labels.tolist())) == 15


def insight_corpus() -> list[Trajectory]:
    """Three topics of four single-turn episodes; one failure each in the flight and file topics."""
    return ([traj(f"f{i}", "book a flight" + (", cancel the old one" if i == 0 else ""),
                  ["search_flights", "book_flight"]) for i in range(3)]
            + [traj("f3", "book a flight", ["book_flight"], success=False)]
            + [traj(f"w{i}", "weather report" + (", cancel the alert" if i == 0 else ""),
                    ["get_weather", "send_email"])
               for i in range(4)]
            + [traj(f"d{i}", "show my files", ["list_files"]) for i in range(3)]
            + [traj("d3", "show my files", ["list_files", "send_email"], success=False,
                    results=["a.txt", "error: no recipient"])])


def test_insight_clusters_and_offline_extract(tiny_resources):
    mem = build_insight_memory().fit(insight_corpus(), tiny_resources)
    # 12 summaries: no grid K is below 12/3 = 4, so K = 3 (the largest below n/3), without a silhouette.
    assert mem.k == 3 and mem.silhouettes == {}
    topics = [e.trajectory_id[0] for e in mem.episodes]
    by_topic = {t: {int(lab) for lab, tt in zip(mem.labels, topics) if tt == t} for t in "fwd"}
    assert all(len(v) == 1 for v in by_topic.values()) and len(set.union(*by_topic.values())) == 3
    files = mem.insights[by_topic["d"].pop()]
    assert files.startswith(f"cluster {mem.labels[-1].item()} "
                            "(offline extract; 3 succeeded, 1 failed episodes)")
    assert "Do: list_files (3x)" in files and "Avoid: list_files -> send_email (1x)" in files
    flights = mem.insights[by_topic["f"].pop()]
    assert "Do: search_flights -> book_flight (3x)" in flights and "Avoid: book_flight (1x)" in flights
    assert "failing opening: book_flight (1x)" in flights


def test_insight_retrieves_the_clusters_of_the_two_nearest_summaries(tiny_resources):
    mem = build_insight_memory().fit(insight_corpus(), tiny_resources)
    label = {e.trajectory_id: int(lab) for e, lab in zip(mem.episodes, mem.labels)}
    steps = [step((), "weather today?"), step((), "please cancel")]
    # "weather" is nearest to the four weather summaries: both neighbours in one cluster, added once.
    # "cancel" is nearest to f0 and w0 (the only summaries with 'cancel', cos 1/sqrt3): two clusters.
    assert mem.clusters(steps) == [[label["w1"]], [label["f0"], label["w0"]]]
    # the same by brute force over the embedded summaries
    q = tiny_resources.embedder.encode(["user: weather today?", "user: please cancel"])
    sim = (q @ mem.embeddings.T).numpy()
    for row, got in zip(sim, mem.clusters(steps)):
        top2 = np.argsort(-row, kind="stable")[:2]
        assert got == list(dict.fromkeys(int(mem.labels[i]) for i in top2))
    block = mem.guidance(steps)
    assert block[0].count("\n- ") == 1 and block[1].count("\n- ") == 2
    assert "offline extract" in block[0] and mem.insights[label["w1"]] in block[0]

    scorer = build_scorer("insight")
    scorer.fit(insight_corpus(), tiny_resources)
    s = scorer.score(steps)
    assert s.present_all and s.fell_back.all() and s.guidance == block
    assert s.diagnostics["guidance_chars"].tolist() == [len(g) for g in block]


def test_insight_with_a_model_distils_one_call_per_cluster(tiny_registry, keyword_embedder):
    model = FakeModel()
    res = Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0, executor=model)
    mem = build_insight_memory(summarizer="offline").fit(insight_corpus(), res)
    assert mem.model_calls == 0 and "offline extract" in mem.guidance([step((), "weather")])[0]
    mem = build_insight_memory().fit(insight_corpus(), res)
    # 7 distinct episode digests (f0, f1 = f2, f3, w0, w1 = w2 = w3, d0 = d1 = d2, d3): 7 summary calls. The
    # model summarises all of them alike, so the 12 summaries are one point: K = 1 and one distillation call.
    assert mem.k == 1 and mem.model_calls == model.calls == 7 + 1
    assert mem.insights == [FakeModel.lesson.join(("cluster 0 (distilled by the model): ", ""))]
    assert "insights distilled by the model" in mem.guidance([step((), "weather")])[0]
