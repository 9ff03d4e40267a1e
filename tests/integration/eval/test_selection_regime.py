"""regime=selection: teacher-forced selection by a model over HTTP on a seeded sample of steps, against the
stub OpenAI server (tests/stub_openai_server.py), with every count worked out by hand."""

from __future__ import annotations

import json

import pytest
from builders import FixedRankScorer
from stub_openai_server import StubOpenAIServer, count_prompt_tokens

from tracer.core.steps import extract_steps
from tracer.eval.metrics import METRICS
from tracer.eval.pooled import pooled_outcomes, wilson
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.executors.openai import OpenAIExecutor
from tracer.executors.oracle import OracleExecutor
from tracer.jobs.evaluate import run_job, summary_table

# random.Random(0).sample of the 16 test steps of bfcl-small (folds=2: multi_turn_base_0's 10 steps in fold 0,
# multi_turn_base_1's 6 in fold 1), as (trajectory, step index, gold tool)
SAMPLED = [("multi_turn_base_0", 0, "cd"), ("multi_turn_base_0", 4, "grep"), ("multi_turn_base_0", 6, "cd"),
           ("multi_turn_base_0", 8, "cd"), ("multi_turn_base_1", 2, "mv"), ("multi_turn_base_1", 5, "tail")]


def scripted_model(body: dict) -> dict:
    """A model whose answer depends on the first presented tool: ``cd`` is called (with FixedRankScorer(2.0)
    the first presented tool is the gold), ``grep`` makes it call a tool it was not shown, ``mv`` makes it
    answer in words, ``tail`` makes it write arguments that are not JSON; any other is called."""
    first = body["tools"][0]["function"]["name"]
    if first == "mv":
        return {"content": "Done.", "tool_calls": None}
    name, arguments = {"grep": ("not_shown", "{}"), "tail": ("tail", '{"lines": 1')}.get(first, (first, "{}"))
    return {"content": None, "tool_calls": [{"id": "c", "type": "function",
                                             "function": {"name": name, "arguments": arguments}}]}


def _run(bfcl_small, executor, gold: float, k: int):
    ds, res = bfcl_small
    cfg = EvalConfig(k=k, folds=2, seed=0, regime="selection", sample_steps=6, latency_sample=0,
                     progress=False)
    return Evaluator(ds, lambda: FixedRankScorer(gold=gold), res, executor, cfg).run()


def test_the_model_is_asked_about_the_sampled_steps_with_their_gold_prefix(bfcl_small):
    with StubOpenAIServer(policy=scripted_model, delay_s=0.05) as server:
        executor = OpenAIExecutor(base_url=server.url, model="stub", api_key_env=None, concurrency=1)
        out = _run(bfcl_small, executor, gold=2.0, k=3)
    records = out.records
    assert [(r.trajectory_id, r.step, r.gold) for r in records] == SAMPLED
    # each request: the step's gold prefix and the 3 presented tools, gold first
    steps = {(s.trajectory_id, s.index): s for t in bfcl_small[0].trajectories
             for s in extract_steps(t)}
    for body, r in zip(server.requests, records):
        assert body["messages"] == json.loads(json.dumps(list(steps[r.trajectory_id, r.step].context)))
        assert [t["function"]["name"] for t in body["tools"]] == r.presented and r.presented[0] == r.gold
        assert r.prompt_tokens == count_prompt_tokens(body["messages"], body["tools"])
        assert r.prompt_tokens_by == "server" and r.executor_seconds >= 0.05
    # cd, grep, cd, cd, mv, tail: 3 correct, 1 unpresented, 1 without a call, 1 malformed
    assert [r.correct for r in records] == [True, False, True, True, False, False]
    assert [r.selected for r in records] == ["cd", "not_shown", "cd", "cd", None, None]
    assert [(r.unpresented, r.no_call, r.malformed) for r in records] == [
        (False, False, False), (True, False, False), (False, False, False), (False, False, False),
        (False, True, False), (False, False, True)]
    pooled = pooled_outcomes(records)
    assert pooled["n_steps"] == 6
    assert pooled["selection_accuracy"] == {"successes": 3, "n": 6, "rate": 0.5, "wilson95": wilson(3, 6)}
    assert pooled["recall_at_k"]["successes"] == 6
    assert [pooled[k]["successes"] for k in ("unpresented_call_rate", "no_call_rate", "malformed_rate",
                                             "executor_error_rate")] == [1, 1, 1, 0]
    mean_tokens = sum(count_prompt_tokens(b["messages"], b["tools"]) for b in server.requests) / 6
    assert pooled["prompt_tokens"]["mean"] == pytest.approx(mean_tokens)
    assert pooled["prompt_tokens_by_server"] == 6 and pooled["executor_seconds"]["n"] == 6
    assert pooled["executor_seconds"]["median"] >= 0.05
    # per fold: fold 0 has 4 sampled steps (3 correct), fold 1 has 2 (none)
    assert [f["selection_accuracy"] for f in out.per_fold] == [0.75, 0.0]


def test_every_scorer_and_k_is_asked_about_the_same_steps(bfcl_small):
    """Paired: the gold ranked last at k = 5 is never shown (the scripted model calls the first tool it sees,
    never the gold); the oracle on the same steps is correct exactly where the gold is presented."""
    with StubOpenAIServer(policy=scripted_model) as server:
        executor = OpenAIExecutor(base_url=server.url, model="stub", api_key_env=None, concurrency=2)
        missed = _run(bfcl_small, executor, gold=-1e9, k=5).records
    oracle = _run(bfcl_small, OracleExecutor(), gold=2.0, k=1).records
    assert [(r.trajectory_id, r.step) for r in missed] == [(t, i) for t, i, _ in SAMPLED]
    assert [(r.trajectory_id, r.step) for r in oracle] == [(t, i) for t, i, _ in SAMPLED]
    assert not any(r.hit_at_k or r.correct for r in missed) and len(server.requests) == 6
    assert all(r.hit_at_k and r.correct and r.executor_seconds is None for r in oracle)


def test_a_sample_larger_than_the_test_steps_is_all_of_them(bfcl_small):
    ds, res = bfcl_small
    cfg = EvalConfig(k=1, folds=2, seed=0, regime="selection", sample_steps=100, latency_sample=0,
                     progress=False)
    out = Evaluator(ds, lambda: FixedRankScorer(gold=2.0), res, OracleExecutor(), cfg).run()
    assert len(out.records) == 16


def test_wilson_interval_matches_the_formula():
    """3 of 6 at z = 1.959964: centre (3 + z²/2) / (6 + z²) = 0.5, half-width
    z·sqrt(6·0.25 + z²/4) / (6 + z²) = 1.959964 · 1.568555 / 9.841459 = 0.312383. 0 of 10: [0, z²/(10 + z²)]
    = [0, 3.841459 / 13.841459] = [0, 0.277533]."""
    assert wilson(3, 6) == pytest.approx([0.187617, 0.812383], abs=1e-6)
    assert wilson(0, 10) == pytest.approx([0.0, 0.277533], abs=1e-6)
    assert wilson(0, 0) is None


def test_the_summary_prints_the_pooled_shares():
    half = {"successes": 3, "n": 6, "rate": 0.5, "wilson95": wilson(3, 6)}
    pooled = {"n_steps": 6, "selection_accuracy": half,
              "recall_at_k": {"successes": 0, "n": 0, "rate": None, "wilson95": None},
              **{k: {"successes": 0, "n": 6, "rate": 0.0, "wilson95": wilson(0, 6)}
                 for k in ("unpresented_call_rate", "malformed_rate", "no_call_rate", "executor_error_rate")},
              "prompt_tokens": {"n": 6, "mean": 812.5, "median": 800.0},
              "executor_seconds": {"n": 0, "mean": None, "median": None}}
    doc = {"dataset": "bfcl", "registry_size": 240, "scorer": "vector", "k": 5, "regime": "selection",
           "executor": "openai", "n_steps": 6, "folds": 2, "mean": dict.fromkeys(METRICS),
           "sd": dict.fromkeys(METRICS), "pooled": pooled}
    lines = summary_table(doc)
    assert "    selection_accuracy       0.500 [0.188, 0.812]  (3/6)" in lines.splitlines()
    assert "    recall_at_k              –" in lines.splitlines()
    assert "    prompt_tokens            mean 812.5 tokens, median 800.0 tokens" in lines.splitlines()
    assert not any(line.strip().startswith("executor_seconds") for line in lines.splitlines())


def test_a_sample_of_no_steps_is_refused_by_its_override(tmp_path):
    refused = r"regime.steps \(override regime.steps=...\) must be an int >= 1, got 0"
    with pytest.raises(ValueError, match=refused):
        run_job({"regime": {"name": "selection", "steps": 0}}, tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_free_running_sample_of_no_tasks_is_refused_by_its_override(tmp_path):
    refused = r"regime.tasks \(override regime.tasks=...\) must be an int >= 1, got 0"
    with pytest.raises(ValueError, match=refused):
        run_job({"regime": {"name": "free_running", "tasks": 0}}, tmp_path)
    assert not any(tmp_path.iterdir())
