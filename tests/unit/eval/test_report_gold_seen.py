"""``report --paired A B --gold unseen``: the paired test over the steps whose gold tool the fold's training
never called (``gold_seen`` in steps.jsonl), worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracer.eval.metrics import StepRecord
from tracer.eval.report import paired


def run(root: Path, name: str, ranks: list[tuple[int, bool | None]]) -> Path:
    """A run directory whose steps.jsonl holds one step per (gold rank, gold_seen)."""
    d = root / name
    d.mkdir()
    rows = [StepRecord(fold=0, trajectory_id=f"t{i}", group=f"g{i}", step=0, turn=0, position=0, gold="a",
                       gold_rank=r, ranking=[], presented=[], in_trie=None, fell_back=None, kappa=None,
                       selected=None, correct=None, hit_at_k=r <= 5, prompt_tokens=0, prompt_tokens_local=0,
                       full_registry_tokens=0, gold_seen=seen).to_json() for i, (r, seen) in enumerate(ranks)]
    (d / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_paired_over_unseen_or_seen_steps_only(tmp_path):
    seen = [True, True, True, False, False]
    a = run(tmp_path, "a", list(zip([1, 1, 1, 9, 2], seen)))
    b = run(tmp_path, "b", list(zip([9, 9, 9, 1, 1], seen)))
    unseen = paired(a, b, gold="unseen")
    # steps 3 and 4: A hits 1 of 2, B 2 of 2
    assert unseen["n"] == 2 and unseen["gold"] == "unseen"
    assert unseen["mean_a"] == 0.5 and unseen["mean_b"] == 1.0 and unseen["mean_diff"] == pytest.approx(-0.5)
    rr = paired(a, b, metric="rr", gold="seen")  # steps 0-2: A 1 each, B 1/9 each
    assert rr["n"] == 3 and rr["mean_a"] == 1.0 and rr["mean_b"] == pytest.approx(1 / 9)
    assert paired(a, b)["n"] == 5 and "gold" not in paired(a, b)


def test_a_run_without_gold_seen_is_refused(tmp_path):
    a = run(tmp_path, "a", [(1, None), (2, None)])
    with pytest.raises(ValueError, match="no gold_seen"):
        paired(a, a, gold="unseen")
    with pytest.raises(ValueError, match="seen' or 'unseen"):
        paired(a, a, gold="never")
