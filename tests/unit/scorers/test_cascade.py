"""The cascade (tracer/scorers/cascade.py): its gate by hand, its threshold from the fast stage's out-of-fold
fit, and each step answered by exactly one stage, as that stage fitted alone answers it.

Two keyword encoders over the tiny corpus: the fast stage's knows every keyword, the slow stage's does not
know "book" (so the two stages rank differently), as in the conformance test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from builders import KEYWORDS, TINY_TOOLS, KeywordEmbedder, call, result, tiny_trajectories

from tracer.build import build_scorer, load_config
from tracer.core.steps import extract_all
from tracer.core.types import Registry, Tool, Trajectory
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources
from tracer.scorers.cascade import CascadeScorer, gate_confidence

HEAD = {"max_epochs": 20, "inner_folds": 3}
# both stages serve their models (the guard would not, on 3 trajectories)
MODEL = {"kind": "vector", "guard": False}
SLOW_KEYWORDS = tuple(k for k in KEYWORDS if k != "book")


def cascade(escalate: float) -> CascadeScorer:
    return build_scorer("cascade", escalate=escalate, fast={"head": HEAD, "zero_shot": MODEL},
                        slow={"head": HEAD, "zero_shot": MODEL})


@pytest.fixture
def stages(tiny_registry):
    """(resources with a slow stage, training trajectories, test steps)."""
    res = Resources.build(tiny_registry, KeywordEmbedder(), device="cpu", seed=0)
    res.slow = Resources.build(tiny_registry, KeywordEmbedder(SLOW_KEYWORDS), device="cpu", seed=0)
    held_out = Trajectory(id="h0", group="h0", domain="tiny", messages=(
        {"role": "user", "content": "Find a flight to Rome and book it"}, call("search_flights", 0),
        result(0), call("book_flight", 1), result(1),
        {"role": "user", "content": "and the weather there, by email"},
        call("get_weather", 2), result(2), call("send_email", 3), result(3)))
    trajs = tiny_trajectories()
    return res, trajs, extract_all(trajs + [held_out])


# ---- the gate ------------------------------------------------------------------------------------------
def test_gate_is_the_softmax_mass_of_the_k_best_candidates():
    inf = float("-inf")
    s = np.array([[2.0, 1.0, 0.0, inf], [inf, inf, inf, inf], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    e2, e1, e0 = math.exp(2), math.exp(1), 1.0
    np.testing.assert_allclose(gate_confidence(s, 2), [(e2 + e1) / (e2 + e1 + e0), 0.0, 0.5], rtol=1e-12)
    np.testing.assert_allclose(gate_confidence(s, 1), [e2 / (e2 + e1 + e0), 0.0, 0.25], rtol=1e-12)
    # k beyond the candidates: all their mass
    assert gate_confidence(s, 9).tolist() == [1.0, 0.0, 1.0]
    assert gate_confidence(np.zeros((3, 0), np.float32), 5).tolist() == [0.0, 0.0, 0.0]


def test_gate_of_a_step_is_the_same_bits_over_its_candidates_and_over_the_whole_registry():
    """The live path reads a step's C candidate scores, the batched one the row scattered over N tools (-inf
    elsewhere): the same gate to the bit, so both paths escalate the same steps."""
    rng = np.random.default_rng(0)
    for c in (3, 8, 13, 130):
        s = rng.normal(size=c).astype(np.float32) * 3                 # [C]
        row = np.full(240, -np.inf, np.float32)
        row[rng.choice(240, c, replace=False)] = s                    # [N]
        for k in (1, 5):
            assert gate_confidence(s[None], k)[0] == gate_confidence(row[None], k)[0]


# ---- fitting ---------------------------------------------------------------------------------------------
def test_threshold_is_the_escalate_quantile_of_the_fast_stages_out_of_fold_gate(stages):
    res, trajs, _ = stages
    sc = cascade(0.3)
    report = sc.fit(trajs, res)
    conf = gate_confidence(sc.fast.inner_scores.numpy(), 5)          # [S] every training step, out of fold
    assert len(conf) == sc.history["inner_steps"] == report.n_steps
    assert sc.threshold == float(np.quantile(conf, 0.3)) == sc.history["thresholds"]["0.30"]
    assert sc.history["thresholds"]["0.05"] <= sc.threshold <= sc.history["thresholds"]["0.95"]
    assert sc.history["inner_escalated"] == float((conf < sc.threshold).mean()) > 0
    assert sc.fast.res is res and sc.slow.res is res.slow and sc.res is res
    assert report.history["threshold"] == sc.threshold and "slow.seconds_fit" in report.history


@pytest.mark.parametrize("escalate", [0.0, 0.5, 1.0])
def test_each_step_is_answered_by_one_stage_as_that_stage_alone_answers_it(stages, escalate):
    res, trajs, steps = stages
    sc = cascade(escalate)
    sc.fit(trajs, res)
    fast = build_scorer("tracer_plus", name="cascade.fast", head=HEAD, zero_shot=MODEL)
    fast.fit(trajs, res)
    slow = build_scorer("tracer_plus", name="cascade.slow", head=HEAD, zero_shot=MODEL)
    slow.fit(trajs, res.slow)
    got, a, b = sc.score(steps), fast.score(steps), slow.score(steps)
    conf = gate_confidence(torch.where(a.fell_back[:, None], float("-inf"), a.primary).numpy(), 5)
    up = torch.from_numpy(conf < sc.threshold)                       # [B]
    assert got.diagnostics["escalated"].bool().tolist() == up.tolist()
    assert got.diagnostics["gate"].tolist() == torch.from_numpy(conf).float().tolist()
    if escalate == 0.0:
        assert not up.any()
    elif escalate == 1.0:
        assert up.all()
    else:
        assert 0 < int(up.sum()) < len(steps)
    for field in ("primary", "fallback", "fell_back"):
        want = torch.where(up[:, None] if field != "fell_back" else up, getattr(b, field), getattr(a, field))
        assert torch.equal(getattr(got, field), want), field
    for key in ("kappa", "in_candidates", "in_trie"):
        want = torch.where(up, b.diagnostics[key].to(a.diagnostics[key].dtype), a.diagnostics[key])
        assert torch.equal(got.diagnostics[key], want), key


def test_a_live_step_runs_the_slow_encoder_only_when_it_escalates(stages):
    res, trajs, steps = stages
    sc = cascade(0.3)
    sc.fit(trajs, res)
    up = sc.score(steps).diagnostics["escalated"].bool()
    encoded = []
    slow_encode = res.slow.embedder.encode
    res.slow.embedder.encode = lambda texts: encoded.append(len(texts)) or slow_encode(texts)
    for i, step in enumerate(steps):
        before = len(encoded)
        sc.select_one(step, sc.embed([step]), 3)
        assert (len(encoded) > before) == bool(up[i]), i


# ---- what is refused ---------------------------------------------------------------------------------------
def test_resources_without_a_slow_stage_are_refused(stages):
    res, trajs, _ = stages
    res.slow = None
    with pytest.raises(ValueError, match="no slow stage.*encoder_training=cascade"):
        cascade(0.3).fit(trajs, res)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"escalate": 1.5}, ValueError, "escalate must be a share between 0 and 1, got 1.5"),
    ({"escalate": True}, ValueError, "escalate must be a share"),
    ({"gate_k": 0}, ValueError, "gate_k must be an int >= 1, got 0"),
    ({"fast": "vector"}, TypeError, "fast must be a tracer_plus scorer"),
    ({"slow": "transfer"}, ValueError, "slow.transfer"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, error, match):
    args = {"name": "cascade", "fast": build_scorer("tracer_plus"), "slow": build_scorer("tracer_plus"),
            "escalate": 0.3, "gate_k": 5, **kwargs}
    if args["fast"] == "vector":
        args["fast"] = build_scorer("vector")
    if args["slow"] == "transfer":
        args["slow"] = build_scorer("tracer_plus", transfer="some/model.pt")
    with pytest.raises(error, match=match):
        CascadeScorer(**args)


def test_the_cascade_recipe_nests_its_slow_recipe_with_the_runs_seed():
    cfg = load_config("encoder_training", "cascade", seed=3)
    assert cfg.seed == 3 and cfg.slow.seed == 3
    assert cfg.kind == "static" and cfg.inner_encoders and cfg.context_weight == 0.5  # static_contexts.yaml
    assert cfg.slow.serve_as["variant"] == "int8" and "kind" not in cfg.slow           # mnrl_int8.yaml
    assert load_config("encoder_training", "mnrl_int8", seed=3) == cfg.slow


# ---- saving -----------------------------------------------------------------------------------------------
def test_a_saved_cascade_loads_to_the_same_stages_threshold_and_scores(stages, tmp_path):
    res, trajs, steps = stages
    sc = cascade(0.3)
    sc.fit(trajs, res)
    before = sc.score(steps)
    sc.save(tmp_path / "idx")
    loaded = CascadeScorer.load(tmp_path / "idx", res.embedder, slow_embedder=res.slow.embedder, device="cpu")
    assert ((loaded.threshold, loaded.escalate, loaded.gate_k, loaded.history)
            == (sc.threshold, 0.3, 5, sc.history))
    assert loaded.res.slow is loaded.slow.res and loaded.fast.res.embedder is res.embedder
    after = loaded.score(steps)
    for field in ("primary", "fallback", "fell_back"):
        assert torch.equal(getattr(after, field), getattr(before, field)), field
    assert torch.equal(after.diagnostics["escalated"], before.diagnostics["escalated"])
    for i, step in enumerate(steps):
        assert loaded.select_one(step, loaded.embed([step]), 3) == sc.select_one(step, sc.embed([step]), 3), i
    snap = next((tmp_path / "idx" / "snapshots").iterdir())
    files = sorted(p.name for p in snap.iterdir())
    assert "meta.json" in files and "fast.model.pt" in files and "slow.trie_0.pt" in files
    assert all(p.is_file() for p in snap.iterdir())                      # flat: every file in the manifest


def test_loading_a_cascade_without_its_slow_embedder_says_so(stages, tmp_path):
    res, trajs, _ = stages
    sc = cascade(0.3)
    sc.fit(trajs, res)
    sc.save(tmp_path / "idx")
    with pytest.raises(ValueError, match=r"meta.json: a cascade's slow stage needs its embedder "
                                         r"\('keyword:flight,cancel,weather,email,file'\)"):
        CascadeScorer.load(tmp_path / "idx", res.embedder)
    with pytest.raises(ValueError, match=r"snapshots/[^/]+/slow.meta.json: index was built with embedder "
                                         r"'keyword:flight,cancel,weather,email,file' \(dim 6\), "
                                         r"not 'keyword:flight,book"):
        # the stages' encoders swapped
        CascadeScorer.load(tmp_path / "idx", res.embedder, slow_embedder=res.embedder)


def test_updating_a_cascade_in_place_is_refused_before_anything_changes(stages):
    from tracer.retriever import Retriever

    res, trajs, steps = stages
    sc = cascade(0.3)
    sc.fit(trajs, res)
    before = sc.score(steps)
    with pytest.raises(TypeError, match="a cascade is not updated in place"):
        Retriever(sc).update(trajs[:2])
    assert torch.equal(sc.score(steps).primary, before.primary)


def test_each_step_keeps_the_novel_slot_claim_of_the_stage_that_answers_it(stages):
    _, trajs, steps = stages
    # one tool no trajectory calls, so the fast stage's slot has something to claim
    registry = Registry((*TINY_TOOLS, Tool("archive_files", "Archive old files into a zip")))
    res = Resources.build(registry, KeywordEmbedder(), device="cpu", seed=0)
    res.slow = Resources.build(registry, KeywordEmbedder(SLOW_KEYWORDS), device="cpu", seed=0)
    novel = {**MODEL, "novel": 7}  # the whole ranking: every never-called tool claims the slot
    sc = build_scorer("cascade", escalate=0.5, fast={"head": HEAD, "zero_shot": novel},
                      slow={"head": HEAD, "zero_shot": MODEL})
    sc.fit(trajs, res)
    fast = build_scorer("tracer_plus", name="cascade.fast", head=HEAD, zero_shot=novel)
    fast.fit(trajs, res)
    got, a = sc.score(steps), fast.score(steps)
    up = got.diagnostics["escalated"].bool().tolist()
    assert any(up) and not all(up) and all(a.reserve)
    # the fast stage's claims where it answers, none where the slow stage (novel off) does
    assert got.reserve == [() if u else r for u, r in zip(up, a.reserve)]
    presented = finalize(got, 2, True).presented
    assert [sc.select_one(s, sc.embed([s]), 2) for s in steps] == presented                # live = batched
