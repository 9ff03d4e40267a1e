"""A cold start in evaluate.py (``train_trajectories=N``): each outer fold fits on the first N of its training
trajectories in the learning curves' seeded order; the held-out steps do not change. And the held-out-tools
split (``holdout_tools=true``): a fold's training calls none of the fold's tools."""

from __future__ import annotations

import dataclasses
import random

import pytest
from builders import ROOT, TINY_TOOLS, tiny_trajectories
from hydra import compose, initialize_config_dir

from tracer.build import build_scorer
from tracer.core.folds import kfold, tool_folds
from tracer.core.steps import extract_all
from tracer.core.types import Registry
from tracer.data import Dataset
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.executors.oracle import OracleExecutor
from tracer.jobs.evaluate import run_job

TINY_TOOLS_CALLED = [t.name for t in TINY_TOOLS]  # every tiny tool is called by some trajectory


def _dataset() -> Dataset:
    trajs = [dataclasses.replace(t, id=f"{t.id}-{v}", group=f"{t.group}-{v}")
             for v in range(4) for t in tiny_trajectories()]
    return Dataset("tiny", Registry(TINY_TOOLS), tuple(trajs))


def _evaluator(ds: Dataset, n: int | None, res, holdout: bool = False) -> Evaluator:
    cfg = EvalConfig(k=2, folds=2, seed=3, latency_sample=0, progress=False, train_trajectories=n,
                     holdout_tools=holdout)
    return Evaluator(ds, lambda: build_scorer("tracer_plus"), res, OracleExecutor(), cfg)


def test_a_fold_fits_on_the_first_n_of_its_seeded_order_and_tests_on_the_same_steps(tiny_resources):
    ds = _dataset()
    full = _evaluator(ds, None, tiny_resources)
    for n in (0, 3, 1000):
        cold = _evaluator(ds, n, tiny_resources)
        for split in kfold(ds.trajectories, 2, 3):  # the learning curves' folds and order
            order = list(split.train)
            random.Random(3 * 1000 + split.fold).shuffle(order)
            train, test = cold.split(split.fold)
            assert [t.id for t in train] == [t.id for t in order[:n]]
            assert test == full.split(split.fold)[1]
    # tracer_plus fitted on no trajectory serves its zero-shot ranking
    result = _evaluator(ds, 0, tiny_resources).run()
    assert result.n_steps > 0 and all(info["serves"] == "zero_shot" for info in result.scorer_info)


@pytest.mark.parametrize("override, error, match", [
    ("train_trajectories=-1", ValueError,
     r"train_trajectories \(override train_trajectories=...\) must be an int >= 0, got -1"),
    ("holdout_tools=yes", TypeError, r"holdout_tools \(override holdout_tools=...\) must be true or false"),
])
def test_a_bad_cold_start_option_is_refused_naming_the_override(tmp_path, override, error, match):
    with initialize_config_dir(str(ROOT / "tracer" / "configs"), version_base="1.3"):
        cfg = compose("evaluate", overrides=["dataset=jsonl", f"dataset.path={tmp_path / 'nowhere'}",
                                             override])
    with pytest.raises(error, match=match):
        run_job(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_holding_tools_out_drops_every_training_trajectory_that_calls_one(tiny_resources):
    ds = _dataset()
    folds = tool_folds(ds.trajectories, 2, 3)
    assert sorted(folds) == sorted(TINY_TOOLS_CALLED) and set(folds.values()) == {0, 1}
    full, held = _evaluator(ds, None, tiny_resources), _evaluator(ds, None, tiny_resources, holdout=True)
    for fold in (0, 1):
        out = {tool for tool, f in folds.items() if f == fold}
        train, test = held.split(fold)
        assert test == full.split(fold)[1]
        assert [t for t in full.split(fold)[0] if not out & {s.gold for s in extract_all([t])}] == train
        assert 0 < len(train) < len(full.split(fold)[0])
    result = held.run()
    unseen = [r for r in result.records if not r.gold_seen]
    assert {r.gold for r in unseen} == set(TINY_TOOLS_CALLED)   # every called tool is held out once
