"""Hand-computed checks of Insight, the literature baseline: its grid of k, k chosen by silhouette, the
clusters and the offline extract, retrieval through the two nearest summaries, and a model's distilled
calls, on the tiny corpus whose transitions and cosines test_baselines.py's docstring works out."""

from __future__ import annotations

import numpy as np
import pytest
from builders import FakeModel, step, traj

from tracer.build import build_insight_memory, build_scorer
from tracer.core.types import Trajectory
from tracer.scorer_base.resources import Resources
from tracer.scorers.insight import candidate_ks, select_k


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
