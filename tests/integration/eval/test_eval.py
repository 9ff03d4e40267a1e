"""The evaluation: metrics by hand, paired folds, regimes, free-running on BFCL (the oracle, an OpenAI
endpoint). The command line (multirun + report, W&B, the paired report): test_eval_cli.py."""

from __future__ import annotations

import json

import pytest
import torch

from tracer.core.steps import extract_steps, gold_turns, step_from_messages
from tracer.data import Dataset
from tracer.encode.embedders import CachedEmbedder
from tracer.eval.metrics import StepRecord, aggregate, fold_metrics, paired_test
from tracer.eval.pooled import pooled_lines, pooled_outcomes, wilson
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.executors import OracleExecutor
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources


class ScriptedScorer(ScorerBase):
    """Test scorer: a fixed preference over the registry, or the gold first ("perfect"), or the gold never.

    It records every step it is asked to score, so tests can see what context each regime feeds.
    """

    def __init__(self, mode: str = "registry_order", hide: str | None = None):
        self.name, self.pad, self.mode, self.hide = f"scripted_{mode}", True, mode, hide
        self.seen: list = []

    def fit(self, trajectories, res):
        self.res = res
        return FitReport(self.name, len(trajectories), 0, 0.0)

    def score(self, steps):
        self.seen.extend(steps)
        n = len(self.res.registry)
        base = -torch.arange(n, dtype=torch.float32).repeat(len(steps), 1)  # registry order
        for i, s in enumerate(steps):
            if s.gold and s.gold in self.res.registry:
                g = self.res.registry.id(s.gold)
                if self.mode == "perfect" and s.gold != self.hide:
                    base[i, g] = 1.0
                elif self.mode == "wrong" or s.gold == self.hide:
                    base[i, g] = -1e9  # ranked last: never presented at small k
        return Scores(primary=base, fallback=torch.zeros(len(steps), n),
                      fell_back=torch.zeros(len(steps), dtype=torch.bool))


def _records(hits_ranks):
    return [StepRecord(fold=0, trajectory_id="t", group="g", step=i, turn=0, position=0, gold="x",
                       gold_rank=r,
                       ranking=[], presented=[], in_trie=it, fell_back=fb, kappa=None, selected=None,
                       correct=c, hit_at_k=r is not None and r <= 2, prompt_tokens=p, prompt_tokens_local=p,
                       full_registry_tokens=100)
            for i, (r, it, fb, c, p) in enumerate(hits_ranks)]


def test_fold_metrics_by_hand():
    recs = _records([(1, True, False, True, 10), (3, False, True, False, 20), (None, False, True, False, 30),
                     (2, True, False, True, 40)])
    m = fold_metrics(recs, trie_based=True, task_success=[True, False], latencies_ms=[1.0, 2.0, 3.0, 4.0])
    assert m["recall_at_1"] == pytest.approx(1 / 4)          # the ranking's first: rank 1 only
    assert m["recall_at_k"] == pytest.approx(2 / 4)          # ranks 1 and 2 are within k=2
    assert m["mrr"] == pytest.approx((1 + 1 / 3 + 0 + 1 / 2) / 4)
    assert m["selection_accuracy"] == pytest.approx(0.5)
    assert m["cic_tokens"] == pytest.approx(25.0)
    assert m["cic_full_registry_tokens"] == pytest.approx(100.0)
    assert m["cic_reduction"] == pytest.approx(0.75)
    assert m["out_of_trie_rate"] == pytest.approx(0.5)
    assert m["fallback_rate"] == pytest.approx(0.5)
    assert m["recall_out_of_trie"] == pytest.approx(0.0)      # ranks 3 and None
    assert m["task_success"] == pytest.approx(0.5)
    assert m["latency_ms_p50"] == pytest.approx(2.5)
    mean, sd = aggregate([m, {**m, "recall_at_k": 1.0}])
    assert mean["recall_at_k"] == pytest.approx(0.75)
    assert sd["recall_at_k"] == pytest.approx(((0.25 ** 2 * 2) / 1) ** 0.5)  # sample SD of (0.5, 1.0)
    assert fold_metrics(recs, trie_based=False)["out_of_trie_rate"] is None
    mean, _ = aggregate([m, {**m, "recall_out_of_trie": None}])  # a fold without out-of-trie steps
    assert (mean["recall_out_of_trie"] == 0.0
            and aggregate([{**m, "task_success": None}])[0]["task_success"] is None)


def test_paired_test_detects_a_real_difference():
    a = [1.0] * 60 + [0.0] * 40
    b = [0.0] * 60 + [0.0] * 40
    res = paired_test(a, b, n_resamples=2000, seed=0)
    assert res["mean_diff"] == pytest.approx(0.6) and res["p_value"] < 0.01
    assert paired_test(a, a, n_resamples=500)["p_value"] == pytest.approx(1.0)


def _tiny_eval(tiny_trajs, tiny_resources, scorer, folds=5, k=2, regime="teacher_forcing"):
    ds = Dataset("tiny", tiny_resources.registry, tuple(tiny_trajs))
    cfg = EvalConfig(k=k, folds=folds, seed=0, regime=regime, latency_sample=2, progress=False)
    return Evaluator(ds, lambda: scorer, tiny_resources, OracleExecutor(), cfg).run()


def test_toy_run_metrics_by_hand(tiny_trajs, tiny_resources):
    # registry order ranks gold g at position id(g)+1; each of 5 folds holds one conversation.
    # per-fold recall@2: t0 1, t1 2/3, t2 0, t3 1/2, t4 0; MRR: .75, (1+1/2+1/3)/3, (1/4+1/5)/2, (1+1/4)/2,
    # 1/6
    res = _tiny_eval(tiny_trajs, tiny_resources, ScriptedScorer())
    assert res.n_steps == 10
    assert res.mean["recall_at_k"] == pytest.approx((1 + 2 / 3 + 0 + 0.5 + 0) / 5)
    assert res.mean["recall_at_1"] == pytest.approx((1 / 2 + 1 / 3 + 0 + 1 / 2 + 0) / 5)
    assert res.mean["mrr"] == pytest.approx((0.75 + (1 + 0.5 + 1 / 3) / 3 + 0.225 + 0.625 + 1 / 6) / 5)
    assert res.mean["selection_accuracy"] == pytest.approx(res.mean["recall_at_k"])  # oracle = coverage
    for r in res.records:  # prompt cost = conversation + presented schemas, reduction against the registry
        assert len(r.presented) == 2 and r.prompt_tokens < r.full_registry_tokens
    assert res.mean["out_of_trie_rate"] is None and res.mean["task_success"] is None
    assert res.mean["latency_ms_p50"] is not None


def test_steps_whose_gold_the_folds_training_never_called_are_unseen(tiny_trajs, tiny_resources):
    # one conversation per fold: cancel_booking (t1), send_email (t2) and list_files (t4) are called nowhere
    # else, so their 3 steps are unseen; the 7 others seen. Ranks as in the test above (registry order).
    from tracer.eval.metrics import by_gold_seen

    res = _tiny_eval(tiny_trajs, tiny_resources, ScriptedScorer())
    unseen = sorted((r.trajectory_id, r.gold) for r in res.records if r.gold_seen is False)
    assert unseen == [("t1", "cancel_booking"), ("t2", "send_email"), ("t4", "list_files")]
    split = by_gold_seen(res.records)
    assert (split["unseen"] == {"n_steps": 3, "recall_at_1": 0.0, "recall_at_k": 0.0,
                                "mrr": pytest.approx((1 / 3 + 1 / 5 + 1 / 6) / 3)})
    assert split["seen"] == {"n_steps": 7, "recall_at_1": pytest.approx(3 / 7),
                             "recall_at_k": pytest.approx(5 / 7), "mrr": pytest.approx(4.5 / 7)}


class EncodesGold(ScriptedScorer):
    """The scripted scorer that also embeds each step's gold name through its resources' embedder."""

    def score(self, steps):
        self.res.embedder.encode([s.gold for s in steps])
        return super().score(steps)


def test_latency_is_measured_past_the_embedding_cache(tiny_trajs, tiny_registry, keyword_embedder):
    """Each sampled step is encoded by the embedder inside the cache, though the cache holds its text, and
    the cache is the resources' embedder again afterwards."""

    class Counting(type(keyword_embedder)):
        texts = 0

        def encode(self, texts):
            Counting.texts += len(texts)
            return super().encode(texts)

    cached = CachedEmbedder(Counting())
    res = Resources.build(tiny_registry, cached, device="cpu", seed=0)
    scorer = EncodesGold()
    scorer.fit([], res)
    steps = [s for t in tiny_trajs for s in extract_steps(t)]
    scorer.score(steps)  # every gold name is in the cache now
    before = Counting.texts
    scorer.score(steps)
    assert Counting.texts == before  # served by the cache
    ds = Dataset("tiny", tiny_registry, tuple(tiny_trajs))
    cfg = EvalConfig(k=2, folds=2, seed=0, latency_sample=3, progress=False)
    times = Evaluator(ds, lambda: scorer, res, OracleExecutor(), cfg).latencies(scorer, None, steps, fold=0)
    assert len(times) == 3 and Counting.texts == before + 3  # one text a step, each encoded for real
    assert res.embedder is cached


def test_folds_are_identical_across_scorers(tiny_trajs, tiny_resources):
    from tracer.build import build_scorer

    a = _tiny_eval(tiny_trajs, tiny_resources, ScriptedScorer(), folds=3)
    b = _tiny_eval(tiny_trajs, tiny_resources, build_scorer("vector"), folds=3)
    key = lambda res: sorted((r.fold, r.trajectory_id, r.step) for r in res.records)
    assert key(a) == key(b)


def test_step_from_messages_matches_extracted_steps(tiny_trajs):
    for traj in tiny_trajs:
        for s in extract_steps(traj):
            live = step_from_messages(s.context)
            assert (live.prefix, live.history, live.turn) == (s.prefix, s.history, s.turn)


# ---- BFCL: regimes and free-running on the real backends
# -----------------------------------------------------
@pytest.fixture(scope="module")
def bfcl_small():
    from tracer.data import load_dataset

    ds = load_dataset("bfcl", categories=["base"])
    trajs = [t for t in ds.trajectories
             if t.id in ("multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2",
                         "multi_turn_base_3")]
    return Dataset("bfcl-small", ds.registry, tuple(trajs), environment=ds.environment)


@pytest.fixture(scope="module")
def bfcl_res(bfcl_small):
    from builders import KeywordEmbedder

    return Resources.build(bfcl_small.registry, KeywordEmbedder(), device="cpu")


def _run(ds, res, scorer, regime, k=1):
    cfg = EvalConfig(k=k, folds=2, seed=0, regime=regime, latency_sample=0, progress=False)
    return Evaluator(ds, lambda: scorer, res, OracleExecutor(), cfg).run()


def test_teacher_forcing_never_feeds_a_wrong_call_forward(bfcl_small, bfcl_res):
    scorer = ScriptedScorer("wrong")
    tf = _run(bfcl_small, bfcl_res, scorer, "teacher_forcing")
    assert tf.mean["recall_at_k"] == 0.0
    gold = {(s.trajectory_id, s.index): s.history for t in bfcl_small.trajectories for s in extract_steps(t)}
    assert all(s.history == gold[(s.trajectory_id, s.index)] for s in scorer.seen)

    scorer = ScriptedScorer("wrong")
    fr = _run(bfcl_small, bfcl_res, scorer, "free_running")
    golds_done = {t.id: [c.name for _, calls in gold_turns(t) for c in calls]
                  for t in bfcl_small.trajectories}
    wrong_fed = [s for s in scorer.seen if any(h not in golds_done[s.trajectory_id] for h in s.history)]
    assert wrong_fed, "free-running carries the executor's wrong calls forward"
    assert fr.mean["task_success"] == 0.0


def test_free_running_oracle_with_perfect_scorer_succeeds_and_fails_without_a_tool(bfcl_small, bfcl_res):
    res = _run(bfcl_small, bfcl_res, ScriptedScorer("perfect"), "free_running")
    assert res.mean["task_success"] == 1.0 and all(t["success"] for t in res.tasks)
    assert res.mean["recall_at_k"] == 1.0
    needed = next(c.name for c in gold_turns(bfcl_small.trajectories[0])[0][1])
    res = _run(bfcl_small, bfcl_res, ScriptedScorer("perfect", hide=needed), "free_running")
    failed = {t["trajectory_id"] for t in res.tasks if not t["success"]}
    assert bfcl_small.trajectories[0].id in failed


def test_free_running_task_sample_is_seeded_and_the_same_for_every_scorer(bfcl_small, bfcl_res):
    """``regime.tasks``: a seeded sample of all folds' test tasks, drawn before any scorer runs, so two
    scorers run exactly the same tasks; a sample as large as the test set runs every task."""
    def run(scorer, n, seed=0):
        cfg = EvalConfig(k=1, folds=2, seed=seed, regime="free_running", latency_sample=0, progress=False,
                         sample_tasks=n)
        return Evaluator(bfcl_small, lambda: scorer, bfcl_res, OracleExecutor(), cfg).run()

    every = {t.id for t in bfcl_small.trajectories}
    perfect, wrong = run(ScriptedScorer("perfect"), 2), run(ScriptedScorer("wrong"), 2)
    ran = [t["trajectory_id"] for t in perfect.tasks]
    assert len(ran) == 2 and set(ran) <= every
    assert sorted(ran) == sorted(t["trajectory_id"] for t in wrong.tasks)
    assert {r.trajectory_id for r in perfect.records} == set(ran)
    assert [t["success"] for t in perfect.tasks] == [True, True]
    assert not any(t["success"] for t in wrong.tasks)
    pooled = pooled_outcomes(wrong.records, wrong.tasks)
    assert pooled["task_success"] == {"successes": 0, "n": 2, "rate": 0.0, "wilson95": wilson(0, 2)}
    assert "    task_success             0.000 [0.000, 0.658]  (0/2)" in pooled_lines(pooled)
    assert {t["trajectory_id"] for t in run(ScriptedScorer("perfect"), len(every) + 5).tasks} == every
    draws = {frozenset(t["trajectory_id"] for t in run(ScriptedScorer("perfect"), 2, seed).tasks)
             for seed in range(6)}
    assert len(draws) > 1, "the sample follows the seed"


def test_gold_turns_align_with_gold_states_on_turns_without_calls():
    """BFCL turns whose ground truth is empty (clarification turns) stay turns of their own, so turn i of
    the free-running episode is compared with gold state i: no later turn's calls are merged into them."""
    from tracer.data import load_dataset
    from tracer.data.bfcl_backends import gold_states

    ds = load_dataset("bfcl", categories=["base", "miss_param"])
    for t in ds.trajectories:
        turns = gold_turns(t)
        n_user = sum(m.get("role") == "user" for m in t.messages)
        assert len(turns) == n_user, t.id
        steps = extract_steps(t)
        assert [s.turn for s in steps] == [i for i, (_, calls) in enumerate(turns) for _ in calls], t.id
    # multi_turn_base_180: BFCL turn 3 ("get the invoice") has no gold call; turn 4 creates a ticket
    t = next(t for t in ds.trajectories if t.id == "multi_turn_base_180")
    turns = gold_turns(t)
    assert [len(c) for _, c in turns] == [2, 2, 1, 0, 0, 2] and len(gold_states(t)) == len(turns)


def test_free_running_oracle_solves_turns_without_calls_and_turns_beyond_the_cap(bfcl_res):
    from tracer.data import load_dataset

    ds = load_dataset("bfcl", categories=["base", "miss_param", "long_context"])
    ids = ("multi_turn_base_180", "multi_turn_miss_param_0", "multi_turn_miss_param_1",
           "multi_turn_long_context_46")
    trajs = tuple(t for t in ds.trajectories if t.id in ids)
    assert any(not calls for t in trajs for _, calls in gold_turns(t))
    # long_context_46's one turn needs 34 calls: more than the 20-step cap, so the cap stretches to cover them
    assert max(len(calls) for t in trajs for _, calls in gold_turns(t)) == 34
    small = Dataset("bfcl-empty-turns", ds.registry, trajs, environment=ds.environment)
    res = _run(small, bfcl_res, ScriptedScorer("perfect"), "free_running")
    assert len(res.tasks) == 4 and all(t["success"] for t in res.tasks), res.tasks
    assert all(len(t["turns_ok"]) == len(gold_turns(next(x for x in trajs if x.id == t["trajectory_id"])))
               for t in res.tasks)


def _gold_agent(trajs):
    """A scripted model behind the stub server: after each user message it makes that turn's gold calls in
    order, each only if the tool was presented, then answers in text (which ends the turn)."""
    by_user = {u["content"]: calls for t in trajs for users, calls in gold_turns(t) for u in users}

    def policy(body):
        msgs = body["messages"]
        last = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        made = sum(len(m.get("tool_calls") or []) for m in msgs[last:] if m["role"] == "assistant")
        calls = by_user[msgs[last]["content"]]
        presented = {t["function"]["name"] for t in body.get("tools") or []}
        if made < len(calls) and calls[made].name in presented:
            c = calls[made]
            return {"content": None,
                    "tool_calls": [{"id": f"agent-{len(msgs)}", "type": "function", "function": {
                "name": c.name, "arguments": json.dumps(c.arguments)}}]}
        return {"content": "Done.", "tool_calls": []}

    return policy


def test_free_running_through_an_openai_endpoint(bfcl_small, bfcl_res):
    """evaluate's free-running loop against a real HTTP server speaking the OpenAI protocol: the model's calls
    run on BFCL's backends, its text answer ends a turn, prompt tokens are the server's count."""
    from stub_openai_server import StubOpenAIServer, count_prompt_tokens

    from tracer.executors.openai import OpenAIExecutor

    cfg = EvalConfig(k=3, folds=2, seed=0, regime="free_running", latency_sample=0, progress=False)
    with StubOpenAIServer(policy=_gold_agent(bfcl_small.trajectories)) as server:
        ex = OpenAIExecutor(base_url=server.url, model="stub", api_key_env=None, concurrency=2)
        res = Evaluator(bfcl_small, lambda: ScriptedScorer("perfect"), bfcl_res, ex, cfg).run()
        sent = list(server.requests)
    assert res.mean["task_success"] == 1.0 and len(res.tasks) == 4
    n_turns = sum(len(gold_turns(t)) for t in bfcl_small.trajectories)
    n_calls = sum(len(c) for t in bfcl_small.trajectories for _, c in gold_turns(t))
    # every gold call, plus one text answer per turn
    assert len(res.records) == len(sent) == n_calls + n_turns
    assert sum(r.selected is None for r in res.records) == n_turns
    server_counts = sorted(count_prompt_tokens(b["messages"], b["tools"]) for b in sent)
    assert sorted(r.prompt_tokens for r in res.records) == server_counts
    assert all(r.prompt_tokens != r.prompt_tokens_local for r in res.records)  # the server's count, not ours
    # the model's own call ids are carried forward in the conversation it is sent next; its turn-ending text
    # is not
    assert any(tc["id"].startswith("agent-") for b in sent for m in b["messages"]
               for tc in m.get("tool_calls") or [])
    assert not any(m.get("content") == "Done." for b in sent for m in b["messages"])

    # a needed tool never presented: the agent cannot make that call, answers in text, and the task fails
    needed = next(c.name for c in gold_turns(bfcl_small.trajectories[0])[0][1])
    with StubOpenAIServer(policy=_gold_agent(bfcl_small.trajectories)) as server:
        ex = OpenAIExecutor(base_url=server.url, model="stub", api_key_env=None)
        res = Evaluator(bfcl_small, lambda: ScriptedScorer("perfect", hide=needed), bfcl_res, ex, cfg).run()
    assert bfcl_small.trajectories[0].id in {t["trajectory_id"] for t in res.tasks if not t["success"]}


def test_free_running_refused_without_an_environment(tiny_trajs, tiny_resources):
    with pytest.raises(ValueError, match="teacher_forcing only"):
        _tiny_eval(tiny_trajs, tiny_resources, ScriptedScorer(), regime="free_running")


class ReservingScorer(ScriptedScorer):
    """Registry order, with the last registry tool (list_files) claiming a reserved slot at every step."""

    def score(self, steps):
        out = super().score(steps)
        out.reserve, out.reserve_slots = [(len(self.res.registry) - 1,)] * len(steps), 1
        return out


def test_recall_counts_the_tools_presented_reserved_slots_included(tiny_trajs, tiny_resources):
    # list_files (t4's only step, rank 6 in registry order) is presented in the reserved last slot: a hit,
    # though the ranking's top 2 misses it; every other step keeps its first slot, so recall@2 is recall@1
    plain = _tiny_eval(tiny_trajs, tiny_resources, ScriptedScorer())
    res = _tiny_eval(tiny_trajs, tiny_resources, ReservingScorer())
    for r in res.records:
        assert r.presented[-1] == "list_files" and r.hit_at_k == (r.gold in r.presented)
    files = [r for r in res.records if r.gold == "list_files"]
    assert files and all(r.hit_at_k and r.gold_rank == 6 for r in files)
    assert [r.hit_at_k for r in plain.records if r.gold == "list_files"] == [False] * len(files)
    assert res.mean["mrr"] == plain.mean["mrr"]                            # a ranking metric: unchanged
    assert res.mean["recall_at_k"] == pytest.approx(res.mean["selection_accuracy"])
