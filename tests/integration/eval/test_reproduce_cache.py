"""``reproduce_results`` runs each row in an empty embedding cache of its own: the override it adds to every
command, resolved by a real Hydra multirun of evaluate.py, puts each job's vectors under its run directory and
leaves the shared cache alone (why: the module docstring)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from builders import ROOT

from experiments.reproduce import reproduce_results as rr


@pytest.mark.slow  # a real Hydra multirun of evaluate.py for the experiments' script: make test-all
def test_every_rerun_embeds_into_an_empty_cache_of_its_own(native_dir, tmp_path, monkeypatch):
    launched = []

    def record(cmd, **kwargs):  # what run() launches: its commands, without running BFCL
        launched.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    with monkeypatch.context() as m:
        m.setattr(subprocess, "run", record)
        assert rr.run(rr.PARTS["ablation"], ["full", "mlp"], tmp_path) == 0
        assert rr.run(rr.PARTS["presets"], ["zero_shot"], tmp_path) == 0
    assert len(launched) == 2 and all(cmd.count(rr.OWN_CACHE) == 1 for cmd in launched), launched

    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "evaluate.py"), "-m", "dataset=jsonl", f"dataset.path={native_dir}",
           "scorer=vector", "k=1,2", "folds=2", "progress=false", "latency_sample=0",
           f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=job${hydra.job.num}", rr.OWN_CACHE]
    out = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for job in ("job0", "job1"):
        assert json.loads((sweep / job / "metrics.json").read_text())["n_steps"] == 10
        assert list((sweep / job / "embeddings").rglob("*.npz")), job  # each job encoded into its own cache
    assert not (tmp_path / ".cache").exists()  # the shared cache (paths.cache, under the working directory)
