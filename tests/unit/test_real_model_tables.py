"""experiments/real_model's tables read evaluate.py's run directories (experiments/real_model/runs_dir.py)."""

import json

import pytest

from experiments.real_model import free_running_table, table
from experiments.real_model.runs_dir import cell, read_runs
from tracer.eval.pooled import share


def write_run(path, metrics, steps, tasks=None):
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps(metrics))
    (path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    if tasks is not None:
        (path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))


def step(task, i, selected, gold, correct, seconds=2.0, tokens=100):
    return {"trajectory_id": task, "step": i, "selected": selected, "gold": gold, "correct": correct,
            "hit_at_k": gold is not None, "unpresented": False, "malformed": False,
            "no_call": selected is None, "prompt_tokens": tokens, "executor_seconds": seconds}


def test_cell_prints_rate_interval_and_counts():
    one_of_two = {"rate": 0.5, "wilson95": [0.0945, 0.9055], "successes": 1, "n": 2}
    assert cell(one_of_two) == "0.50 [0.09, 0.91] (1/2)"


def test_read_runs_skips_unfinished_and_labels_the_whole_registry(tmp_path):
    write_run(tmp_path / "b_llm", {"scorer": "llm_only", "k": 5, "registry_size": 128}, [])
    write_run(tmp_path / "a_plus", {"scorer": "tracer_plus", "k": 3, "registry_size": 240}, [])
    (tmp_path / "c_unfinished").mkdir()
    runs = read_runs(tmp_path)
    assert list(runs) == ["a_plus", "b_llm"]
    assert runs["a_plus"].label == ("tracer_plus", "3") and runs["b_llm"].label == ("llm_only", "all 128")


def test_free_running_row_counts_successes_repeats_and_the_oracle(tmp_path):
    steps = [step("t1", 0, "cd", "cd", True, seconds=1), step("t1", 1, "cd", "ls", False, seconds=3),
             step("t2", 0, None, None, False, seconds=5)]
    write_run(tmp_path / "model" / "plus", {"scorer": "tracer_plus", "k": 5, "registry_size": 240}, steps,
              [{"trajectory_id": "t1", "success": False}, {"trajectory_id": "t2", "success": True}])
    # the oracle ran a third task first: only the model's tasks count
    write_run(tmp_path / "oracle" / "plus", {"scorer": "tracer_plus", "k": 5, "registry_size": 240}, [],
              [{"trajectory_id": t, "success": t != "t2"} for t in ("t0", "t1", "t2")])
    lines = free_running_table.table(tmp_path / "model", tmp_path / "oracle").splitlines()
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:6] == ["tracer_plus", "5", "2", cell_of(1, 2), cell_of(1, 2), "3"]
    assert cells[6] == cell_of(1, 2)                # gold called on the two steps with a gold tool
    assert cells[11] == cell_of(1, 1)               # t1's second step repeated its first call
    assert cells[12:] == ["100", "3 / 3"]
    assert lines[-1] == "Tasks: t1, t2"


def test_free_running_refuses_runs_of_other_tasks(tmp_path):
    meta = {"scorer": "vector", "k": 5, "registry_size": 240}
    for name, task in (("a", "t1"), ("b", "t2")):
        write_run(tmp_path / name, meta, [step(task, 0, "cd", "cd", True)],
                  [{"trajectory_id": task, "success": True}])
    with pytest.raises(SystemExit, match="did not run the same tasks"):
        free_running_table.table(tmp_path, None)


def test_selection_table_pairs_runs_on_their_common_steps(tmp_path):
    plus = [step("t1", i, "cd", "cd", ok) for i, ok in enumerate([True, True, True, False])]
    vector = [step("t1", i, "cd", "cd", ok) for i, ok in enumerate([False, False, True])]
    write_run(tmp_path / "tracer_plus_k5", {"scorer": "tracer_plus", "k": 5, "registry_size": 240}, plus)
    write_run(tmp_path / "vector_k5", {"scorer": "vector", "k": 5, "registry_size": 240}, vector)
    runs = table.load_runs(tmp_path)
    assert table.paired(runs) == [("- tracer_plus_k5 against vector_k5 on their 3 common steps: 2 right only "
                                   "with tracer_plus_k5, 0 only with vector_k5 (exact McNemar p = 0.50)")]


def cell_of(successes, n):
    return cell(share([True] * successes + [False] * (n - successes)))
