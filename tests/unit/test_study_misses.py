"""experiments/studies/general_encoder/misses.py: a miss is a prerequisite miss only when a later call of the
same turn was presented at that step; ceiling.py: recall@j over another run's unseen steps or its misses
without the gold among the candidates."""

from __future__ import annotations

import json

from builders import traj

from experiments.studies.general_encoder.ceiling import recall_on, uncovered_misses, unseen_steps
from experiments.studies.general_encoder.misses import main, predecessor_slot, prerequisite_misses
from tracer.eval.metrics import StepRecord


def record(step: int, turn: int, gold: str, presented: list[str], trajectory: str = "t") -> StepRecord:
    return StepRecord(fold=0, trajectory_id=trajectory, group=trajectory, step=step, turn=turn, position=0,
                      gold=gold, gold_rank=None, ranking=presented, presented=presented, in_trie=None,
                      fell_back=None, kappa=None, selected=None, correct=None, hit_at_k=None, prompt_tokens=0,
                      prompt_tokens_local=0, full_registry_tokens=0)


RECORDS = [
    record(0, 0, "pressBrakePedal", ["startEngine", "lockDoors"]),  # startEngine comes later this turn
    record(1, 0, "startEngine", ["startEngine"]),                    # a hit
    record(2, 1, "cd", ["ls"]),                                      # ls is called, but in the next turn
    record(3, 2, "ls", ["mv"]),
    record(4, 2, "mv", ["cat"]),                                     # a miss whose later call is no hit
    record(0, 0, "a", ["b"], trajectory="u"),                        # b: another trajectory's step 1
    record(1, 0, "b", ["b"], trajectory="v"),
]


def test_only_a_later_call_of_the_same_turn_that_was_presented_makes_a_prerequisite():
    misses, pre = prerequisite_misses(RECORDS)
    assert [(r.trajectory_id, r.step) for r in misses] == [("t", 0), ("t", 2), ("t", 3), ("t", 4), ("u", 0)]
    assert [(r.trajectory_id, r.step) for r in pre] == [("t", 0), ("t", 3)]


def test_the_table_counts_them(tmp_path, capsys):
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in RECORDS))
    main([str(tmp_path), "--top", "1"])
    row = capsys.readouterr().out.splitlines()[-1]
    assert row == f"| {tmp_path} | 7 | 0.286 | 5 | 2 (0.286) | pressBrakePedal 1 |"


def test_the_predecessor_slot_names_the_call_logged_just_before_the_first_presented_tool():
    train = {0: [traj("x", "start the car", ["lockDoors", "pressBrakePedal", "startEngine"]),
                 traj("y", "start it", ["pressBrakePedal", "startEngine"])]}
    records = [
        record(0, 0, "pressBrakePedal", ["startEngine", "lockDoors"]),  # the slot: pressBrakePedal, named
        record(0, 0, "cd", ["ls", "mv"], trajectory="w"),               # ls was never logged: no slot
        record(0, 0, "lockDoors", ["pressBrakePedal", "lockDoors"], trajectory="z"),  # lockDoors is presented
        record(0, 0, "a", ["startEngine", "a"], trajectory="v"),        # a hit in the last place, displaced
    ]
    assert predecessor_slot(records, [records[0]], train) == (1, 1)
    assert predecessor_slot(records, [], train) == (0, 1)
    assert predecessor_slot(records, [records[0]], {1: train[0]}) == (0, 0)  # another fold's logs


def test_the_ceiling_counts_the_gold_in_the_top_j_over_the_other_runs_unseen_steps(tmp_path):
    ranked, holdout = tmp_path / "ranked", tmp_path / "holdout"
    ranks, seen = [1, 3, 4, None, 2], [False, False, False, False, True]
    for run, rows in ((ranked, [record(i, 0, "g", ["g"]) for i in range(5)]),
                      (holdout, [record(i, 0, "g", ["x"]) for i in range(5)])):
        run.mkdir()
        for r, rank, s in zip(rows, ranks, seen):
            r.gold_rank, r.gold_seen = (rank, None) if run is ranked else (None, s)
        (run / "steps.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    keys = unseen_steps(holdout)
    assert len(keys) == 4
    assert recall_on(ranked, keys, 3) == 2
    assert recall_on(ranked, keys, 5) == 3


def test_a_candidate_source_ceiling_counts_only_the_misses_whose_gold_was_no_candidate(tmp_path):
    ranked, model = tmp_path / "ranked", tmp_path / "model"
    # the model: a hit, a miss whose gold was a candidate, two misses whose gold was not, one unknown
    covered = [1.0, 1.0, 0.0, 0.0, None]
    correct = [True, False, False, False, False]
    for run in (ranked, model):
        run.mkdir()
        rows = [record(i, 0, "g", ["x"]) for i in range(5)]
        for r, cov, ok, rank in zip(rows, covered, correct, [1, 2, 8, 12, 1]):
            if run is model:
                r.correct, r.extra = ok, ({} if cov is None else {"in_candidates": cov})
            else:
                r.gold_rank = rank
        (run / "steps.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    keys = uncovered_misses(model)
    assert [k[2] for k in keys] == [2, 3]
    assert recall_on(ranked, keys, 10) == 1 and recall_on(ranked, keys, 12) == 2
