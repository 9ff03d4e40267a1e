"""BFCL multi-turn loader and executable environment, on the installed bfcl_eval data and backends: the
gold calls' results are what the backends return (and what BFCL's own executor returns), errors are
recorded, and the environment executes, keeps its state apart and snapshots it."""

from __future__ import annotations

import copy
import json
from collections import defaultdict

import pytest

pytest.importorskip("bfcl_eval")

from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system import (
    GorillaFileSystem,
)
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

from tracer.core.errors import DataError
from tracer.core.steps import turns_of
from tracer.data import load_dataset
from tracer.data.bfcl import CallBinder, load_registry, parse_call, task_to_trajectory
from tracer.data.bfcl_backends import BFCLBackends, gold_states

# --- execution -----------------------------------------------------------------------------------

def _results(traj):
    return [m["content"] for m in traj.messages if m["role"] == "tool"]


def test_results_are_what_the_backend_returns(by_id):
    t = by_id["multi_turn_base_1"]
    fs = GorillaFileSystem()
    fs._load_scenario(copy.deepcopy(t.metadata["initial_config"]["GorillaFileSystem"]))
    res = _results(t)
    assert t.metadata["ground_truth"][0] == ["ls(a=True)"]
    assert res[0] == json.dumps(fs.ls(a=True))
    assert json.loads(res[0]) == {"current_directory_content": ["workspace"]}
    assert res[1] == json.dumps(fs.cd(folder="workspace")) == '{"current_working_directory": "workspace"}'
    # mkdir returns None, rendered as BFCL does
    assert by_id["multi_turn_base_0"].messages[4]["content"] == "None"
    assert all(t.metadata["execution_errors"] == 0 for t in by_id.values())  # every gold call runs cleanly


def test_results_match_bfcl_own_executor(ds):
    """Our results equal BFCL's execute_multi_turn_func_call, turn by turn, on every 10th task."""
    for t in ds.trajectories[::10]:
        md, theirs = t.metadata, []
        for turn in md["ground_truth"]:
            out, _ = execute_multi_turn_func_call(turn, md["initial_config"], md["involved_classes"],
                                                  "tracer_test", t.id, long_context=md["long_context"])
            theirs += out
        assert _results(t) == theirs, t.id


def test_long_context_loads_the_long_scenario(ds):
    config = _task([])[0]["initial_config"]
    short, long = BFCLBackends(["GorillaFileSystem"], config), BFCLBackends(["GorillaFileSystem"], config,
                                                                  long_context=True)
    assert json.loads(short.execute("ls", {})) == {"current_directory_content": ["a.txt"]}
    assert len(json.loads(long.execute("ls", {}))["current_directory_content"]) > 1  # padded with files
    assert (len(long.execute("cat", {"file_name": "a.txt"}))
            > len(short.execute("cat", {"file_name": "a.txt"})))
    results = defaultdict(dict)
    for t in ds.trajectories:
        results[t.group][t.metadata["category"]] = _results(t)
    assert sum(r["base"] != r["long_context"] for r in results.values()) > 100


def test_execute_false_keeps_the_structure():
    ds = load_dataset("bfcl", categories="miss_func", execute=False)
    assert len(ds.trajectories) == 200 and ds.executable
    t = ds.trajectories[0]
    assert all(m["content"] == "" for m in t.messages if m["role"] == "tool")
    assert "execution_errors" not in t.metadata
    with pytest.raises(ValueError, match="unknown BFCL categories"):
        load_dataset("bfcl", categories=["base", "parallel"])


def _task(calls, question="do it"):
    task = {"id": "multi_turn_base_9999", "question": [[{"role": "user", "content": question}]],
            "initial_config": {"GorillaFileSystem": {"root": {"u": {"type": "directory", "contents": {
                "a.txt": {"type": "file", "content": "hello"}}}}}},
            "involved_classes": ["GorillaFileSystem"]}
    return task, [calls]


def test_execution_error_is_recorded():
    task, truth = _task(["cat(file_name='a.txt')", "cd()", "cat(file_name='missing.txt')"])
    t = task_to_trajectory(task, truth, "base", load_registry())
    ok, raised, reported = _results(t)
    assert ok == '{"file_content": "hello"}'
    assert raised.startswith("Error during execution: ") and "folder" in raised
    # the backend's own failure report: a result, not an error
    assert json.loads(reported).keys() == {"error"}
    assert t.metadata["execution_errors"] == 1
    assert t.group == "bfcl-9999" and t.domain == "GorillaFileSystem"


def test_bad_gold_calls_raise_data_error():
    reg = load_registry()
    with pytest.raises(DataError, match="not a BFCL tool"):
        task_to_trajectory(*_task(["rm_rf(path='/')"]), "base", reg)
    with pytest.raises(DataError, match="has no parameters"):
        task_to_trajectory(*_task(["cd(folder='a', force=True)"]), "base", reg)
    with pytest.raises(DataError, match=r"ground_truth\[0\]\[0\]"):
        task_to_trajectory(*_task(["cd(folder=x)"]), "base", reg)
    with pytest.raises(DataError, match="one list per turn"):
        task_to_trajectory(_task([])[0], [[], []], "base", reg)


# --- environment -----------------------------------------------------------------------------------

def test_env_executes_and_never_raises():
    env = BFCLBackends(["GorillaFileSystem", "MathAPI"], _task([])[0]["initial_config"])
    assert set(env.tools) >= {"ls", "cd", "add", "mean"} and "post_tweet" not in env.tools
    assert env.execute("ls", {}) == '{"current_directory_content": ["a.txt"]}'
    assert env.execute("add", '{"a": 2, "b": -3}') == '{"result": -1}'  # JSON-string arguments too
    assert env.execute("post_tweet", {"content": "x"}).startswith("Error during execution: no tool named")
    assert env.execute("cd", {"nope": 1}).startswith("Error during execution: ")
    assert env.execute("add", "{not json").startswith("Error during execution: ")
    assert (env.calls, env.errors) == (5, 3)


def test_envs_do_not_share_state(by_id):
    md = by_id["multi_turn_base_0"].metadata
    before = copy.deepcopy(md["initial_config"])
    a, b = BFCLBackends.from_metadata(md), BFCLBackends.from_metadata(md)
    assert a.same_state(b)
    a.execute("cd", {"folder": "document"})
    a.execute("mkdir", {"dir_name": "new"})
    assert not a.same_state(b) and b.same_state(BFCLBackends.from_metadata(md))
    assert md["initial_config"] == before


def test_gold_states_match_replay_and_differ_after_another_call(by_id):
    t = by_id["multi_turn_base_0"]
    states = gold_states(t)
    assert len(states) == len(turns_of(t)) == 4
    env = BFCLBackends.from_metadata(t.metadata)
    initial = env.state()
    assert not env.same_state(states[0])  # turn 0 moved a file
    for turn, calls in enumerate(t.metadata["ground_truth"]):
        for text in calls:
            name, args, kwargs = parse_call(text)
            env.execute(name, CallBinder()(name, args, kwargs))
        assert env.same_state(states[turn]), turn
    assert states[0] != initial
    env.execute("touch", {"file_name": "extra.txt"})
    assert not env.same_state(states[-1])
    assert gold_states(t) == states  # deterministic


def test_gold_states_cover_turns_without_calls(by_id):
    t = by_id["multi_turn_miss_param_0"]
    states = gold_states(t)
    assert len(states) == 5 and states[3] == states[2]  # the clarification turn changes nothing


def test_state_is_a_snapshot(by_id):
    env = BFCLBackends.from_metadata(by_id["multi_turn_base_2"].metadata)  # a file-system task
    snap = env.state()
    env.execute("touch", {"file_name": "new.txt"})
    assert not env.same_state(snap) and env.state() != snap
