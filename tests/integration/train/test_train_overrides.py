"""train.py checks every plain override before any work (issue 56, defect 13): ``k=0``, ``k=abc``, ``k=1.5``,
``k=true`` and the held-out run's settings used to fail after loading and fitting (seconds of work), without
the ``(override k=...)`` the docs promise, and left ``outputs/train/<time>_jsonl/`` with ``config.yaml`` (and
an index) behind. evaluate.py and train.py share the one definition,
:func:`tracer.core.validate.check_config`."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from builders import ROOT, TINY_TOOLS, tiny_trajectories
from hydra import compose, initialize_config_dir

from tracer.core.types import Registry
from tracer.data import write_native
from tracer.jobs import evaluate as eval_job
from tracer.jobs import train as train_job


def _tiny_dataset(path: Path) -> Path:
    trajs = [replace(t, id=f"{t.id}-{v}", group=f"{t.group}-{v}")
             for v in range(3) for t in tiny_trajectories()]
    return write_native(path, Registry(TINY_TOOLS), trajs)


@pytest.mark.heavy(seconds=15)
def test_train_k_zero_is_named_before_any_work_and_leaves_no_run_directory(tmp_path):
    """The real CLI: before the fix it loaded MiniLM, fitted, wrote config.yaml and the index, then failed on
    ``k must be an int >= 1, got 0``, and the run directory stayed."""
    data = _tiny_dataset(tmp_path / "tiny")
    cmd = [sys.executable, "train.py", "experiment=preset/zero_shot", "dataset=jsonl", f"dataset.path={data}",
           "folds=0", "k=0", "device=cpu", "embedder.device=cpu", f"embedder.cache_dir={tmp_path / 'cache'}",
           f"hydra.run.dir={tmp_path / 'new' / 'run'}"]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "k (override k=...) must be an int >= 1, got 0" in proc.stderr
    assert not (tmp_path / "new").exists()    # the folders this run created are gone
    assert not (tmp_path / "cache").exists()  # nothing was embedded


@pytest.mark.parametrize(("script", "override", "message"), [
    ("train", "k=abc", r"k \(override k=...\) must be an int >= 1, got 'abc' \(str\)"),
    ("train", "k=1.5", r"k \(override k=...\) must be an int >= 1, got 1.5 \(float\)"),
    ("train", "k=true", r"k \(override k=...\) must be an int >= 1, got True \(bool\)"),
    ("train", "latency_sample=-1", r"latency_sample \(override latency_sample=...\) must be an int >= 0"),
    ("train", "save_index=maybe",
     r"save_index \(override save_index=...\) must be true or false, got 'maybe'"),
    ("train", "insight=1", r"insight \(override insight=...\) must be true or false, got 1"),
    ("train", "max_executor_error_rate=2",
     r"max_executor_error_rate \(override max_executor_error_rate=...\) must be a number in \[0, 1\], got 2"),
    ("train", "+regime.max_steps_per_turn=0",
     r"regime.max_steps_per_turn \(override regime.max_steps_per_turn=...\) must be an int >= 1, got 0"),
    ("evaluate", "progress=yes", r"progress \(override progress=...\) must be true or false, got 'yes'"),
    ("train", "+train_trajectories=-1",
     r"train_trajectories \(override train_trajectories=...\) must be an int >= 0, got -1"),
])
def test_every_plain_override_is_named_before_any_work(tmp_path, script, override, message):
    """The dataset path does not exist: a check that came after loading would name it instead."""
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(script, overrides=["dataset=jsonl", f"dataset.path={tmp_path / 'nowhere'}", override])
    run_job = train_job.run_job if script == "train" else eval_job.run_job
    with pytest.raises((TypeError, ValueError), match=message):
        run_job(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
