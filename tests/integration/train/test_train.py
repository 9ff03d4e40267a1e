"""train.py with the paper's blend head (``experiment=preset/zero_shot scorer=tracer``) end to end: the real
CLI (Hydra, MiniLM) on a tiny native-format dataset in tmp_path.

The run must write the head, its feature statistics, the loss curve, the resolved config, the
report and a deployable index whose scorer uses the head. The presets through train.py: test_train_presets.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from builders import ROOT, TINY_TOOLS, tiny_trajectories
from hydra import compose, initialize_config_dir

from tracer.core.store import current_snapshot
from tracer.core.types import Registry
from tracer.data import write_native
from tracer.learn.blend_head import FEATURES, BlendHead
from tracer.scorer_base.resources import training_steps
from tracer.scorers.tracer import TracerScorer


def _tiny_dataset(path: Path) -> Path:
    """The five tiny conversations, three variants each (15 groups)."""
    trajs = [replace(t, id=f"{t.id}-{v}", group=f"{t.group}-{v}")
             for v in range(3) for t in tiny_trajectories()]
    return write_native(path, Registry(TINY_TOOLS), trajs)


def _train(tmp_path: Path, *overrides: str) -> Path:
    data = _tiny_dataset(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "train.py", "experiment=preset/zero_shot", "scorer=tracer", "dataset=jsonl",
           f"dataset.path={data}", f"embedder.cache_dir={tmp_path / 'cache'}",
           "embedder.device=cpu", "device=cpu", "folds=2", "scorer.head.max_epochs=60",
           f"hydra.run.dir={run_dir}", *overrides]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_train_config_composes():
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        cfg = compose("train", overrides=["experiment=preset/zero_shot", "scorer=tracer", "dataset=jsonl",
                                          "dataset.path=x"])
        scorer = compose("evaluate", overrides=["scorer=tracer"]).scorer
    assert cfg.get("logger") is None and cfg.scorer.name == "tracer"
    assert cfg.scorer == scorer  # train.py and evaluate.py scorer=tracer fit the same head
    assert set(cfg.scorer.head) >= {"inner_folds", "t_floor", "lr", "weight_decay", "max_epochs", "patience"}


@pytest.mark.slow  # the blend head and 2 outer folds through train.py, a W&B run: make test-all
def test_train_end_to_end(tmp_path, minilm):
    """One real run (W&B offline as the logger: one interpreter start instead of two, ~15 s less)."""
    pytest.importorskip("wandb")
    run_dir = _train(tmp_path, "logger=wandb")
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline W&B run written"
    snap = run_dir / "index" / "snapshots" / current_snapshot(run_dir / "index")
    for name in ("blend_head.pt", "feature_stats.json", "history.json", "config.yaml", "report.json",
                 "report.md", "wt_hist.png", snap / "blend_head.pt", snap / "trie.pt", snap / "meta.json",
                 "heldout/metrics.json"):
        assert (run_dir / name).exists(), name
    head = BlendHead.from_state_dict(torch.load(run_dir / "blend_head.pt", weights_only=True))
    stats = json.loads((run_dir / "feature_stats.json").read_text())
    assert stats["features"] == list(FEATURES)
    torch.testing.assert_close(head.mean, torch.tensor(stats["mean"]))
    hist = json.loads((run_dir / "history.json").read_text())
    assert hist["runs"], "no head was trained"
    for run in hist["runs"]:
        assert len(run["val_loss"]) == run["epochs"] and run["best_val_loss"] == min(run["val_loss"])

    full = json.loads((run_dir / "report.json").read_text())
    assert full["preset"] == "preset/zero_shot" and full["scorer"] == "tracer" and full["index"]["bytes"] > 0
    # the held-out numbers are evaluate.py's own document for the same config
    assert full["heldout"]["mean"] == json.loads((run_dir / "heldout" / "metrics.json").read_text())["mean"]
    report = full["blend_head"]
    assert set(report["coefficients"]["w"]) == {*FEATURES, "bias"}
    corr = report["feature_correlation"]
    assert all(corr[f][f] == 1.0 and all(corr[f][g] == corr[g][f] for g in FEATURES) for f in FEATURES)
    a = report["wt"]["all"]
    assert 0 < a["w_mean"] < 1 and a["T_mean"] >= 0.05 and set(report["wt"]["by_domain"]) == {"tiny"}
    assert set(report["ablation"]) == {"fixed", "learned", "bias_only", *(f"-{f}" for f in FEATURES)}
    assert "Table 14" in (run_dir / "report.md").read_text()

    # the deployable index carries the head and its scorer uses it
    scorer = TracerScorer.load(run_dir / "index", minilm, device="cpu")
    assert scorer.blend == "learned" and scorer.head is not None
    torch.testing.assert_close(scorer.head.w_head.weight, head.w_head.weight)
    sc = scorer.score(training_steps(tiny_trajectories(), scorer.res.registry))
    assert "w" in sc.diagnostics and ((sc.diagnostics["w"] > 0) & (sc.diagnostics["w"] < 1)).all()


@pytest.mark.parametrize("script,overrides,message", [
    # more outer folds than tasks: refused after loading, before the fit (it used to fit and save first)
    ("train.py", ["folds=10000"], "folds=10000 (override folds=...): the dataset has 15 groups"),
    ("evaluate.py", ["folds=10000"], "folds=10000 (override folds=...): the dataset has 15 groups"),
])
def test_a_bad_folds_override_is_named_and_leaves_no_run_directory(tmp_path, script, overrides, message):
    data = _tiny_dataset(tmp_path / "tiny")
    run_dir = tmp_path / "new" / "run"
    cmd = [sys.executable, script, "dataset=jsonl", f"dataset.path={data}", "device=cpu",
           "embedder.device=cpu", f"embedder.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run_dir}",
           *overrides]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (tmp_path / "new").exists()  # the folders this run created are gone
    assert not (tmp_path / "cache").exists()  # nothing was embedded: the check ran before any work


def test_a_failed_run_in_an_existing_directory_removes_nothing_of_the_users(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mine.txt").write_text("keep")
    cmd = [sys.executable, "train.py", "dataset=jsonl", f"dataset.path={ROOT / 'README.md'}",
           f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "README.md: is a file; a native dataset is a directory holding tools.json" in proc.stderr
    assert (tmp_path / "run" / "mine.txt").read_text() == "keep"
