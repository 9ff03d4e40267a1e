"""Sweeps through the cluster launchers of the ``cluster`` extra, as real processes: a 2-job evaluate.py sweep
through Hydra's Ray launcher on a local Ray instance and through submitit's local executor (the Slurm
launcher's machinery without a cluster); each job's metrics equal the same run through the basic launcher.
Skipped, with the reason, where the extra is not installed (``pip install -e '.[cluster]'``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from builders import ROOT

SWEEP = ["dataset=jsonl", f"dataset.path={ROOT / 'data' / 'example'}", "registry=native", "folds=2",
         "latency_sample=0", "progress=false"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0"}


def evaluate(*overrides: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "evaluate.py", *overrides], check=False, cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def means(sweep_dir, scorer: str) -> dict:
    (path,) = [p for p in sweep_dir.rglob("metrics.json") if f"scorer={scorer}" in p.parent.name]
    return json.loads(path.read_text())["mean"]


@pytest.mark.slow  # starts Ray or submitit workers: make test-all
@pytest.mark.parametrize("launcher, plugin, extra", [
    ("ray", "hydra_plugins.hydra_ray_launcher", ["+hydra.launcher.ray.init.num_cpus=2"]),
    ("submitit_local", "hydra_plugins.hydra_submitit_launcher", []),
])
def test_a_two_job_sweep_runs_through_the_launcher_and_equals_the_basic_one(tmp_path, launcher, plugin,
                                                                            extra):
    pytest.importorskip(plugin, reason=f"the {launcher} launcher needs the [cluster] extra")
    run = evaluate("-m", f"hydra/launcher={launcher}", *extra, *SWEEP, "scorer=vector,bm25",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}")
    if (launcher == "ray" and run.returncode != 0 and "ray" in run.stderr.lower()
        and "init" in run.stderr.lower()):
        pytest.skip(f"a local Ray instance could not start here: {run.stderr[-300:]}")
    assert run.returncode == 0, run.stderr[-3000:]
    basic = evaluate(*SWEEP, "scorer=bm25", f"hydra.run.dir={tmp_path / 'basic'}")
    assert basic.returncode == 0, basic.stderr[-3000:]
    reference = json.loads((tmp_path / "basic" / "metrics.json").read_text())["mean"]
    timing = ("latency_ms_p50", "latency_ms_p95")
    got = means(tmp_path / "sweep", "bm25")
    assert {k: v for k, v in got.items() if k not in timing} == {
        k: v for k, v in reference.items() if k not in timing}
    assert means(tmp_path / "sweep", "vector")["recall_at_k"] is not None


def test_the_slurm_launcher_composes_with_its_settings_from_the_command_line():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="the [cluster] extra is not installed")
    run = evaluate("--cfg", "hydra", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
                   "hydra.launcher.timeout_min=30", timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "_target_: hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher" in run.stdout
    assert "partition: gpu" in run.stdout and "timeout_min: 30" in run.stdout
