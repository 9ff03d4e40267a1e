"""Selection counted honestly and executor failures visible, against a real OpenAI-compatible HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from builders import ROOT, FixedRankScorer
from stub_openai_server import StubOpenAIServer

from tracer.core.steps import gold_turns
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.executors.openai import OpenAIExecutor
from tracer.jobs.evaluate import tokenizer_label


def _always_gold(trajs):
    """A model that always makes the gold call, whatever it was shown (it knows the task's answers)."""
    by_user = {u["content"]: calls for t in trajs for users, calls in gold_turns(t) for u in users}

    def policy(body):
        msgs = body["messages"]
        last = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        made = sum(len(m.get("tool_calls") or []) for m in msgs[last:] if m["role"] == "assistant")
        c = by_user[msgs[last]["content"]][made]
        return {"content": None, "tool_calls": [{"id": f"g{len(msgs)}", "type": "function", "function": {
            "name": c.name, "arguments": json.dumps(c.arguments)}}]}

    return policy


def test_calls_to_unpresented_tools_are_never_correct(bfcl_small):
    """The server always calls the gold tool, which is never presented: selection 0, every step
    unpresented."""
    ds, res = bfcl_small
    cfg = EvalConfig(k=1, folds=2, seed=0, regime="teacher_forcing", latency_sample=0, progress=False)
    with StubOpenAIServer(policy=_always_gold(ds.trajectories)) as server:
        ex = OpenAIExecutor(base_url=server.url, model="stub", api_key_env=None, concurrency=2)
        out = Evaluator(ds, lambda: FixedRankScorer(gold=-1e9), res, ex, cfg).run()
    assert out.records and all(r.selected == r.gold and r.unpresented and not r.correct for r in out.records)
    assert out.mean["recall_at_k"] == 0.0 and out.mean["selection_accuracy"] == 0.0
    assert out.mean["unpresented_call_rate"] == 1.0
    assert out.mean["executor_error_rate"] == out.mean["malformed_rate"] == out.mean["no_call_rate"] == 0.0
    assert tokenizer_label(out.records, ex.tokenizer_name) == "server:stub"


def test_tokenizer_label_says_what_each_step_used(bfcl_small):
    ds, res = bfcl_small
    cfg = EvalConfig(k=1, folds=2, seed=0, regime="teacher_forcing", latency_sample=0, progress=False)
    with StubOpenAIServer(fail_first=10**6) as server:
        ex = OpenAIExecutor(base_url=server.url, model="stub", api_key_env=None, max_retries=0)
        out = Evaluator(ds, lambda: FixedRankScorer(gold=-1e9), res, ex, cfg).run()
    assert out.mean["executor_error_rate"] == 1.0 and all("HTTP 500" in r.error for r in out.records)
    assert all(r.prompt_tokens == r.prompt_tokens_local and r.prompt_tokens_by == "local"
               for r in out.records)
    assert tokenizer_label(out.records, ex.tokenizer_name).endswith("(local, offline)")
    half = out.records[: len(out.records) // 2]
    for r in half:
        r.prompt_tokens_by = "server"
    assert tokenizer_label(out.records, "server:stub").startswith(f"server:stub on {len(half)} steps, ")


@pytest.mark.slow  # 6-13 s: keeps make test under 5 minutes on a cold clone
def test_a_run_that_failed_at_the_executor_exits_non_zero(native_dir, tmp_path):
    """HTTP 500 on every request: evaluate.py writes its outputs, says why and exits non-zero."""
    run = tmp_path / "run"
    with StubOpenAIServer(fail_first=10**6) as server:
        out = subprocess.run(
            [sys.executable, str(ROOT / "evaluate.py"), "dataset=jsonl", f"dataset.path={native_dir}",
             "scorer=vector",
             "executor=openai", f"executor.base_url={server.url}", "executor.model=stub",
             "executor.api_key_env=null", "executor.max_retries=1", "executor.backoff_s=0.01",
             "progress=false", "latency_sample=0", "folds=2",
             f"embedder.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run}"],
            check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    assert "100.0% of 10 steps failed at the executor (max_executor_error_rate=0.5)" in out.stderr
    assert "HTTP 500" in out.stderr
    doc = json.loads((run / "metrics.json").read_text())
    assert doc["mean"]["executor_error_rate"] == 1.0 and doc["mean"]["selection_accuracy"] == 0.0
    assert json.loads((run / "run_info.json").read_text())["tokenizer"].endswith("(local, offline)")
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 10 and all(s["error"] and not s["no_call"] for s in steps)
    from tracer.eval.report import report

    md = report([run], tmp_path / "report")["markdown"]
    assert ("| teacher_forcing | openai | vector | 5 | 0.000 ± 0.000 | 0.000 ± 0.000 | 0.000 ± 0.000 | "
            "1.000 ± 0.000 |" in md)


def test_withheld_tools_leave_the_presented_set_and_the_next_ranked_fill_in():
    from tracer.eval.runner import without

    ranking = [4, 2, 7, 1, 0, 3]
    assert without((4, 2, 7), ranking, {2}) == (4, 7, 1)
    assert without((4, 2, 7), ranking, {4, 7, 1}) == (2, 0, 3)   # 1 is withheld too, so 0 and 3 fill in
    assert without((4, 2, 7), ranking, {5}) == (4, 2, 7)
    # everything presented: nothing to fill in
    assert without(tuple(ranking), ranking, {3}) == (4, 2, 7, 1, 0)


@pytest.mark.parametrize("scorer_name", ["tracer", "tracer_plus"])
def test_teacher_forced_outcomes_rank_the_gold_as_the_single_step_path_does(scorer_name, tiny_trajs,
                                                                            tiny_resources):
    """tracer.eval.metrics.teacher_forced_outcomes (the scripts' held-out metric, batched through finalize)
    against each step's gold position in the scorer's own single-step ranking (rank_one, numpy)."""
    from dataclasses import replace

    from builders import TINY_TOOLS, fitted_scorer

    from tracer.build import build_scorer
    from tracer.core.steps import extract_all
    from tracer.eval.metrics import teacher_forced_outcomes

    scorer = fitted_scorer(build_scorer(scorer_name), tiny_trajs, tiny_resources)
    # every registry tool as the gold of a few real contexts: golds at every rank, not only first
    steps = [replace(s, gold=t.name) for s in extract_all(tiny_trajs)[:3] for t in TINY_TOOLS]
    got = teacher_forced_outcomes(scorer, steps, 2)
    ranks = [list(scorer.rank_one(s, scorer.embed([s]))).index(tiny_resources.registry.id(s.gold)) + 1
             for s in steps]
    assert got == {"recall@1": [float(r == 1) for r in ranks], "recall@2": [float(r <= 2) for r in ranks],
                   "mrr": pytest.approx([1 / r for r in ranks])}
    assert set(ranks) == set(range(1, len(TINY_TOOLS) + 1))
