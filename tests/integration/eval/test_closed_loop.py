"""The closed loop (``regime=closed_loop``, issue 55) on the tiny dataset with the real MiniLM: every step is
scored before its conversation is learned, a conversation is logged up to its first unpresented call, refits
fire at the scheduled counts, and the report's figures equal a hand computation from the step records."""

from __future__ import annotations

import dataclasses
import json

import pytest
from builders import ROOT, TINY_TOOLS, call, result, tiny_trajectories
from hydra import compose, initialize_config_dir

from tracer.build import build_scorer
from tracer.core.types import Registry, Trajectory
from tracer.data import Dataset
from tracer.eval.closed_loop import ClosedLoopConfig, config_from, presented_log, run_closed_loop
from tracer.eval.closed_loop_report import stream_report
from tracer.jobs.evaluate import run_job
from tracer.scorer_base.resources import Resources


@pytest.fixture(scope="module")
def res(minilm):
    return Resources.build(Registry(TINY_TOOLS), minilm, device="cpu", seed=0)


def conv(tid: str, user: str, *names: str) -> Trajectory:
    msgs = [{"role": "user", "content": user}]
    for i, n in enumerate(names):
        msgs += [call(n, i), result(i)]
    return Trajectory(id=tid, group=tid, domain="tiny", messages=tuple(msgs))


def copies(n: int) -> Dataset:
    """``n`` copies of the tiny conversations, each its own id and group."""
    trajs = [dataclasses.replace(t, id=f"{t.id}-{v}", group=f"{t.group}-{v}")
             for v in range(n) for t in tiny_trajectories()]
    return Dataset("tiny", Registry(TINY_TOOLS), tuple(trajs))


def loop(ds, res, scorer: str, **cfg):
    return run_closed_loop(ds, lambda: build_scorer(scorer), res, ClosedLoopConfig(progress=False, **cfg))


def test_a_step_is_scored_before_its_own_conversation_is_learned(res):
    # the same conversation twice: listing files after the weather is learned only from a log (the vector
    # ranking puts get_weather's neighbours first); ToolNet ranks it first once one copy was learned
    ds = Dataset("tiny", Registry(TINY_TOOLS), (
        conv("a", "What is the weather in Paris?", "get_weather", "list_files"),
        conv("b", "What is the weather in Paris?", "get_weather", "list_files")))
    out = loop(ds, res, "toolnet", k=1, feedback="full")
    first, second = ([s for s in out.steps if s.conversation == c and s.step == 1] for c in (0, 1))
    assert first[0].serves == "standin" and first[0].gold_rank != 1   # learned after it was scored
    assert second[0].gold_rank == 1                                      # learned from the first copy
    assert first[0].zero_shot_rank == second[0].zero_shot_rank == first[0].gold_rank


def test_the_log_stops_before_the_first_unpresented_call():
    t = conv("t", "Find a flight and book it, then email me", "search_flights", "book_flight", "send_email")
    for feedback, success in (("presented_success", True), ("presented_failure", False)):
        logged, cut = presented_log(t, [True, False, True], feedback)
        assert cut == 1 and logged.messages == t.messages[:3] and logged.success is success
        assert logged.id == t.id and logged.reward == (1.0 if success else 0.0)
    logged, cut = presented_log(t, [True, False, True], "full")
    assert cut == 1 and logged == t
    for feedback in ("presented_success", "presented_failure", "full"):  # nothing cut: logged as it was
        assert presented_log(t, [True, True, True], feedback) == (t, None)
    # parallel calls: the assistant message holding the unpresented call goes whole
    both = {"role": "assistant", "content": None,
            "tool_calls": [*call("get_weather", 0)["tool_calls"], *call("send_email", 1)["tool_calls"]]}
    par = dataclasses.replace(t, messages=(t.messages[0], both, result(0), result(1)))
    assert presented_log(par, [True, False], "presented_success")[0].messages == par.messages[:1]
    with pytest.raises(ValueError, match="2 presented flags for 3 calls"):
        presented_log(t, [True, True], "full")


def test_each_logged_conversation_is_cut_where_its_steps_say(res):
    out = loop(copies(2), res, "vector", k=1, feedback="presented_failure")
    for c in out.conversations:
        steps = [s for s in out.steps if s.conversation == c.conversation]
        missed = [s.step for s in steps if not s.hit]
        assert c.cut_at == (missed[0] if missed else None)
        assert c.logged_success is (c.cut_at is None)
        assert c.logged_calls == (c.n_calls if c.cut_at is None else c.cut_at)
    assert any(c.cut_at is not None for c in out.conversations)


@pytest.fixture(scope="module")
def plus_run(res):
    cfg = ClosedLoopConfig(k=2, seed=1, feedback="presented_success", refit_at=(2, 5), refit_growth=2,
                           window=4, progress=False)
    return run_closed_loop(copies(5), lambda: build_scorer("tracer_plus"), res, cfg), cfg


def test_refits_fire_at_the_scheduled_counts(plus_run):
    out, cfg = plus_run
    assert len(out.conversations) == 25 and out.refit_counts == [2, 5, 10, 20] == cfg.refit_counts(25)
    assert [r["trajectories"] for r in out.refits] == [2, 5, 10, 20]  # the Updater's own record
    assert ClosedLoopConfig(refit_at=(10, 25, 50, 100)).refit_counts(900) == [10, 25, 50, 100, 200, 400, 800]
    assert ClosedLoopConfig(refit_at=(3,), refit_growth=None).refit_counts(900) == [3]


def test_the_report_equals_a_hand_computation_from_the_steps(plus_run):
    out, cfg = plus_run
    rep = stream_report(out, cfg)
    steps = [s for s in out.steps if s.counted]
    assert len(steps) == len(out.steps) == 50   # 10 calls in the tiny set, five copies

    def by_hand(part, zs=False):
        ranks = [s.zero_shot_rank if zs else s.gold_rank for s in part]
        hits = [(s.gold in s.presented) if not zs else s.zero_shot_hit for s in part]
        return (sum(r == 1 for r in ranks) / len(part), sum(hits) / len(part),
                sum(1 / r for r in ranks if r) / len(part))

    assert [w["first"] for w in rep["windows"]] == list(range(0, 50, 4))
    assert [w["n_steps"] for w in rep["windows"]] == [4] * 12 + [2]
    for w in rep["windows"]:
        part = steps[w["first"]: w["first"] + 4]
        assert (w["recall_at_1"], w["recall_at_k"], w["mrr"]) == pytest.approx(by_hand(part))
        assert w["zero_shot_recall_at_k"] == pytest.approx(by_hand(part, zs=True)[1])
    half = rep["second_half"]
    assert half["from"] == 25 and half["n_steps"] == 25
    assert (half["recall_at_1"], half["recall_at_k"], half["mrr"]) == pytest.approx(by_hand(steps[25:]))
    first_need = {}
    for s in steps:
        first_need.setdefault(s.gold, s.gold in s.presented)
    assert rep["first_need"]["tools"] == len(first_need) == 6
    assert rep["first_need"]["presented"] == sum(first_need.values())
    shown = {n for s in out.steps for n in s.presented}
    assert rep["never_presented"]["names"] == sorted(set(first_need) - shown)
    gaps = [w["recall_at_k"] - w["zero_shot_recall_at_k"] for w in rep["windows"]]
    assert rep["zero_shot_start"]["min_window_gap"] == pytest.approx(min(gaps))
    assert rep["zero_shot_start"]["never_below"] is (min(gaps) >= -0.01)


def test_a_trial_conversation_shows_both_rankings_and_the_guard_judges_on_them(res):
    cfg = ClosedLoopConfig(k=2, seed=1, feedback="presented_success", refit_at=(2, 5), refit_growth=2,
                           window=4, progress=False)
    out = run_closed_loop(copies(5), lambda: build_scorer("tracer_plus", zero_shot={"trial": 1.0}), res, cfg)
    # every conversation is a trial once the first refit's guard has judged a trained model (after 2)
    assert [c.conversation for c in out.conversations if c.trial] == list(range(2, 25))
    for c in out.conversations:
        steps = [s for s in out.steps if s.conversation == c.conversation]
        for s in steps:
            assert len(s.presented) == cfg.k and not set(s.explored) & set(s.presented)
            assert len(s.explored) <= cfg.k and (c.trial or not s.explored)
        missed = [s.step for s in steps if not (s.gold in s.presented or s.gold in s.explored)]
        assert c.cut_at == (missed[0] if missed else None)   # cut where neither ranking showed the gold
    assert any(s.explored for s in out.steps)
    # the logs marked the trials, and the last refit compared the two rankings on their steps alone
    assert out.scorer_info["fit"]["guard_steps"] == "trial" and out.scorer_info["fit"]["guard_n"] >= 30
    rep = stream_report(out, cfg)["trials"]
    assert rep == {"conversations": 23, "steps": sum(bool(s.explored) for s in out.steps),
                   "extra_tools_per_step": sum(len(s.explored) for s in out.steps) / 50,
                   "model_served_steps": sum(s.serves == "model" for s in out.steps), "all_steps": 50}
    # complete logs of another system hold no trial
    full = run_closed_loop(copies(2), lambda: build_scorer("tracer_plus", zero_shot={"trial": 1.0}), res,
                           dataclasses.replace(cfg, feedback="full", refit_at=(2,)))
    assert not any(c.trial for c in full.conversations) and not any(s.explored for s in full.steps)


def _compose(tmp_path, native_dir, *overrides):
    with initialize_config_dir(str(ROOT / "tracer" / "configs"), version_base="1.3"):
        return compose("evaluate", overrides=[
            "regime=closed_loop", "dataset=jsonl", f"dataset.path={native_dir}", "progress=false",
            f"embedder.cache_dir={tmp_path / 'cache'}", *overrides])


def test_evaluate_runs_the_regime_into_its_run_dir(tmp_path, native_dir):
    doc = run_job(_compose(tmp_path, native_dir, "scorer=vector", "regime.window=4"), tmp_path / "run")
    assert doc["regime"] == "closed_loop" and doc["feedback"] == "presented_success" and doc["n_steps"] == 10
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["stream"] == doc["stream"] and len(saved["windows"]) == 3
    assert len((tmp_path / "run" / "steps.jsonl").read_text().splitlines()) == 10
    assert "| stream | 10 |" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.parametrize("override, match", [
    ("regime.feedback=logged", r"regime.feedback \(override regime.feedback=...\) must be one of"),
    ("regime.refit_at=[25,10]", r"regime.refit_at \(override regime.refit_at=...\) must be increasing"),
    ("regime.window=0", r"regime.window \(override regime.window=...\) must be an int >= 1"),
    ("train_trajectories=3", r"train_trajectories \(override train_trajectories=...\) must stay"),
])
def test_a_bad_closed_loop_option_is_refused_naming_the_override(tmp_path, override, match):
    cfg = _compose(tmp_path, tmp_path / "nowhere", override)
    with pytest.raises(ValueError, match=match):
        run_job(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="feedback must be one of"):
        ClosedLoopConfig(feedback="logged")
    assert config_from({"k": 3, "regime": {"name": "closed_loop"}}).k == 3
