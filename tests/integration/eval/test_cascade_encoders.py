"""A cascade evaluated with per-fold encoders (``encoder_training=cascade``'s mechanism) on the real trainers:
the fast stage a static table trained with clean inner folds, the slow stage MiniLM fine-tuned; both trained
on each outer fold's training trajectories only, the slow stage's encoder never built for an inner fold."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from builders import TINY_TOOLS, tiny_trajectories

from tracer.build import build_fold_encoders, build_scorer
from tracer.core.types import Registry
from tracer.data import Dataset
from tracer.encode.static import distilled
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.executors.oracle import OracleExecutor
from tracer.learn.encoders import TrainConfig

HEAD = {"max_epochs": 10, "inner_folds": 2}
# a few dozen pairs, short texts, one layer of MiniLM (the real slow stage is 6, mnrl_int8.yaml): seconds on
# the CPU
SLOW = TrainConfig(batch_size=6, lr=1e-4, warmup=0.1, epochs=1, max_seq_length=48, seed=0, layers=(5,))


def cascade_recipe(encoder_dir: Path) -> dict:
    common = {"context": {"join_users": True}, "encoder_dir": str(encoder_dir), "device": "cpu"}
    fast = dataclasses.asdict(dataclasses.replace(SLOW, lr=1e-2, max_seq_length=512, layers=()))
    return {**common, "kind": "static", "inner_encoders": True, **fast,
            "slow": {**common, **dataclasses.asdict(SLOW)}}


@pytest.fixture
def recipe(tmp_path):
    # the static table starts from MiniLM's distillation, built once in .cache/encoders
    start = distilled().resolve()
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / start.name).symlink_to(start)
    return cascade_recipe(tmp_path / "enc")


@pytest.mark.slow  # trains encoders: make test-all
def test_both_stages_are_trained_on_the_outer_folds_training_trajectories_only(recipe, tiny_resources):
    # the tiny corpus twice (10 conversations): every inner fold of every outer fold holds pairs to train on
    trajs = tiny_trajectories() + [dataclasses.replace(t, id=f"{t.id}b", group=f"{t.group}b")
                                   for t in tiny_trajectories()]
    ds = Dataset("tiny", Registry(TINY_TOOLS), tuple(trajs))
    fold_encoders = build_fold_encoders(ds.registry, recipe, None, device="cpu")
    ev = Evaluator(ds, lambda: build_scorer("cascade", fast={"head": HEAD}, slow={"head": HEAD}),
                   tiny_resources,
                   OracleExecutor(), EvalConfig(k=2, folds=2, seed=0, latency_sample=0, progress=False),
                   fold_resources=fold_encoders)
    result = ev.run()
    assert result.n_steps > 0 and all("escalated" in r.extra for r in result.records)
    outer = fold_encoders.outer
    # one slow encoder per outer fold, none inner
    assert len(outer) == 2 and len(fold_encoders.slow.history) == 2
    assert len(fold_encoders.history) > 2                                # the fast stage's inner tables
    for fold, h in enumerate(outer):
        train, test = ev.split(fold)
        slow = fold_encoders.slow.history[fold]
        # what run_info.json records
        assert h["slow"] == {k: v for k, v in slow.items() if k != "trajectory_ids"}
        for stage in (h, slow):
            ids = set(stage["trajectory_ids"])
            assert ids and ids <= {t.id for t in train} and not ids & {t.id for t in test}
        assert (h["served_as"].startswith("m2v-trained-")
                and Path(slow["served_as"]).name.startswith("finetuned-"))
    # the last fold's scorer: its stages hold the fold's two encoders
    assert ev.res.embedder.name == outer[1]["served_as"]
    assert ev.res.slow.embedder.name == outer[1]["slow"]["checkpoint"]
    info = result.scorer_info[1]
    assert info["scorer"] == "cascade" and 0 <= info["fit"]["inner_escalated"] <= 1


def test_a_slow_recipe_must_be_a_recipe_without_its_own_slow_stage(tmp_path):
    recipe = cascade_recipe(tmp_path / "enc")  # refused before anything is built: no distillation needed
    with pytest.raises(ValueError, match="encoder_training.slow must be a recipe"):
        build_fold_encoders(Registry(TINY_TOOLS), {**recipe, "slow": "mnrl_int8"})
    with pytest.raises(ValueError, match="encoder_training.slow.slow"):
        build_fold_encoders(Registry(TINY_TOOLS),
                            {**recipe, "slow": {**recipe["slow"], "slow": recipe["slow"]}})
