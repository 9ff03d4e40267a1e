"""Data-parallel encoder training under torchrun (tracer/learn/distributed.py), as real processes: two CPU ranks
with gloo train the static table of the single process, step for step; one rank writes the checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from builders import ROOT, TESTS, tiny_bert

WORKER = Path(__file__).with_name("ddp_worker.py")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(ROOT)}


def run(*launcher: str, base: Path, out: Path) -> None:
    out.mkdir()
    proc = subprocess.run([sys.executable, *launcher, str(WORKER), str(base), str(out), str(TESTS)], check=False,
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow  # three interpreters and a process group: make test-all
def test_two_gloo_ranks_train_the_single_process_table_and_one_writes_it(tmp_path):
    base = tiny_bert(tmp_path / "base")
    run(base=base, out=tmp_path / "one")
    env_world = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    run(*env_world, base=base, out=tmp_path / "two")
    single = json.loads((tmp_path / "one" / "loss0.json").read_text())
    ranks = [json.loads((tmp_path / "two" / f"loss{r}.json").read_text()) for r in (0, 1)]
    assert len(single) == 8 and ranks[0] == ranks[1]               # 2 batches x 4 epochs; every rank the same loss
    np.testing.assert_allclose(ranks[0], single, rtol=1e-5)        # the global batch's loss, as one process
    t0, t1 = (np.load(tmp_path / "two" / f"table{r}.npy") for r in (0, 1))
    assert np.array_equal(t0, t1)                                   # identical steps on both ranks
    np.testing.assert_allclose(t0, np.load(tmp_path / "one" / "table0.npy"), atol=1e-6)
    folders = {(tmp_path / "two" / f"folder{r}.txt").read_text() for r in (0, 1)}
    assert len(folders) == 1                                        # one checkpoint, written by rank 0
    trained = sorted(p.name for p in (tmp_path / "two" / "enc").iterdir() if p.name.startswith("m2v-trained-"))
    assert trained == [Path(folders.pop()).name]
    info = json.loads((tmp_path / "two" / "enc" / trained[0] / "train_info.json").read_text())
    assert info["world_size"] == 2
    # one batch's gradient, summed over the ranks, is the single process's (its scale too)
    g0, g1 = (np.load(tmp_path / "two" / f"grad{r}.npy") for r in (0, 1))
    one = np.load(tmp_path / "one" / "grad0.npy")
    assert np.array_equal(g0, g1) and np.abs(one).sum() > 0
    np.testing.assert_allclose(g0, one, rtol=1e-5, atol=1e-9)
