"""Free-running on BFCL under BFCL's own rules: real tasks, real backends, bfcl_eval's own checker.

Scripted call lists are played through :class:`tracer.envs.bfcl.BFCLEpisode` (the free-running
loop's per-task state) and each finished task gets both verdicts: BFCL's ``multi_turn_checker``
(``success``) and our state comparison (``state_success``).
"""

from __future__ import annotations

import pytest

from tracer.core.steps import gold_turns
from tracer.core.types import ToolCall
from tracer.data import Dataset, load_dataset
from tracer.envs.bfcl import BFCLEpisode
from tracer.envs.bfcl_checker import FORCE_TERMINATED, UNKNOWN_CALL, bfcl_verdict, call_string
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.executors import Decision, OracleExecutor
from tracer.scorer_base.resources import Resources


@pytest.fixture(scope="module")
def bfcl():
    ds = load_dataset("bfcl", categories=["base", "miss_func"])
    return ds, {t.id: t for t in ds.trajectories}


def play(traj, script, max_steps=20):
    """Run one task with ``script[turn]`` as the executor's calls in that turn, then a text answer."""
    ep = BFCLEpisode(traj)
    queue = [list(calls) for calls in script]
    while ep.ready(oracle=False):
        pending = queue[ep.turn] if ep.turn < len(queue) else []
        ep.apply(Decision(call=pending.pop(0) if pending else None), None, max_steps)
    return ep.verdict(fold=0)


def gold_script(traj):
    return [list(calls) for _, calls in gold_turns(traj)]


def test_gold_calls_pass_both_checks(bfcl):
    _, by_id = bfcl
    for tid in ("multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2", "multi_turn_miss_func_0"):
        v = play(by_id[tid], gold_script(by_id[tid]))
        assert v["success"] and v["state_success"] and v["bfcl_error_type"] is None, (tid, v)


def test_no_calls_fail_under_bfcl_on_the_first_turn_with_ground_truth(bfcl):
    _, by_id = bfcl
    v = play(by_id["multi_turn_base_1"], [])
    assert not v["success"] and v["bfcl_error_type"] == "multi_turn:empty_turn_model_response"
    assert not v["state_success"]  # turn 1 moves a file


def test_a_dropped_read_only_lookup_fails_bfcl_but_not_the_state_check(bfcl):
    """multi_turn_base_1, turn 2: cd then grep; grep changes nothing, so only BFCL's response check sees
    it."""
    _, by_id = bfcl
    traj = by_id["multi_turn_base_1"]
    script = gold_script(traj)
    assert [c.name for c in script[2]] == ["cd", "grep"]
    script[2] = script[2][:1]
    v = play(traj, script)
    assert v["state_success"] and not v["success"]
    assert v["bfcl_error_type"] == "multi_turn:execution_response_mismatch"


def test_empty_ground_truth_turns_are_not_checked(bfcl):
    """multi_turn_miss_func_0, turn 2 has no ground truth. A scratch file made there and removed in turn 3
    passes BFCL (turn 3's state and results match), while a turn-by-turn state comparison fails turn 2."""
    _, by_id = bfcl
    traj = by_id["multi_turn_miss_func_0"]
    script = gold_script(traj)
    assert script[2] == [] and [c.name for c in script[3]] == ["sort"]
    script[2] = [ToolCall("touch", {"file_name": "scratch.txt"})]
    script[3] = [ToolCall("rm", {"file_name": "scratch.txt"})] + script[3]
    v = play(traj, script)
    assert v["success"] and not v["state_success"]
    assert v["turns_ok"] == [True, True, False, True, True]


def test_the_step_cap_force_stops_the_task(bfcl):
    """BFCL quits a task at a turn's 21st response with calls; here a step is one call, so the 21st call."""
    _, by_id = bfcl
    traj = by_id["multi_turn_base_1"]
    v = play(traj, [[ToolCall("pwd", {})] * 30])
    assert v["force_terminated"] and v["steps"] == 21 and v["bfcl_error_type"] == FORCE_TERMINATED
    assert not v["success"] and not v["state_success"]
    # 20 calls, then a text answer
    v = play(traj, [[ToolCall("ls", {"a": True})] * 20] + gold_script(traj)[1:])
    assert not v["force_terminated"] and v["success"]


def test_call_strings_are_bfcl_s_and_unsafe_calls_never_run():
    tools = {"cd", "grep"}
    assert call_string(ToolCall("grep", {"file_name": "a.txt", "pattern": "x'y"}), tools) == \
        "grep(file_name='a.txt',pattern=\"x'y\")"
    assert call_string(ToolCall("print", {"x": 1}), tools) == UNKNOWN_CALL           # not a tool of the task
    assert call_string(ToolCall("cd", {"folder) or exit(": 1}), tools) == UNKNOWN_CALL  # not an identifier


def test_verdict_needs_one_call_list_per_turn(bfcl):
    _, by_id = bfcl
    with pytest.raises(ValueError, match="2 turns of calls for 4"):
        bfcl_verdict(by_id["multi_turn_base_1"].metadata, [[], []], {"ls"})


def test_withheld_function_presented_only_from_the_turn_bfcl_adds_it(bfcl):
    from builders import FixedRankScorer, KeywordEmbedder

    ds, by_id = bfcl
    trajs = (by_id["multi_turn_miss_func_0"], by_id["multi_turn_miss_func_1"])
    small = Dataset("bfcl-miss-func", ds.registry, trajs, environment=ds.environment)
    res = Resources.build(small.registry, KeywordEmbedder(), device="cpu")
    cfg = EvalConfig(k=2, folds=2, seed=0, regime="free_running", latency_sample=0, progress=False)
    out = Evaluator(small, lambda: FixedRankScorer(gold=2.0, prefer="sort"), res, OracleExecutor(), cfg).run()
    recs = [r for r in out.records if r.trajectory_id == "multi_turn_miss_func_0"]
    assert trajs[0].metadata["missed_function"] == {"3": ["sort"]}
    assert all("sort" not in r.presented and len(r.presented) == 2 for r in recs if r.turn < 3)
    assert all("sort" in r.presented for r in recs if r.turn >= 3)
    assert all(r.ranking[1] == "sort" or r.gold == "sort" for r in recs)  # the ranking itself is untouched
    assert all(t["success"] and t["state_success"] for t in out.tasks)
