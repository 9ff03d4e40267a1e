"""Data-parallel encoder training under torchrun (tracer/learn/distributed.py), as real processes: two CPU
ranks with gloo train the static table and fine-tune the transformer of the single process, step for step;
one rank writes each checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import ROOT, TESTS, tiny_bert
from model2vec import StaticModel
from safetensors.numpy import load_file
from torch.testing import assert_close

WORKER = Path(__file__).with_name("ddp_worker.py")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(ROOT)}


def run(*launcher: str, base: Path, out: Path) -> None:
    out.mkdir()
    proc = subprocess.run([sys.executable, *launcher, str(WORKER), str(base), str(out), str(TESTS)],
                          check=False, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def no_dropout_bert(out: Path) -> Path:
    """The tiny BERT without dropout: each rank draws its own dropout masks over its shard, so only a model
    without dropout trains the single process's weights on two ranks."""
    base = tiny_bert(out)
    config = json.loads((base / "config.json").read_text())
    config |= {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    (base / "config.json").write_text(json.dumps(config))
    return base


def one_checkpoint(enc: Path, prefix: str, folders: set[str]) -> Path:
    """The one folder both ranks returned, the only one of its kind in the cache, written for 2 ranks."""
    written = sorted(p for p in enc.iterdir() if p.name.startswith(prefix))
    assert len(folders) == 1 and [str(p) for p in written] == list(folders)
    assert json.loads((written[0] / "train_info.json").read_text())["world_size"] == 2
    return written[0]


@pytest.mark.slow  # three interpreters, a process group and two trainings: ~30 s on 2 cores; make test-all
def test_two_gloo_ranks_train_the_single_process_encoders_and_one_writes_each(tmp_path):
    base = no_dropout_bert(tmp_path / "base")
    run(base=base, out=tmp_path / "one")
    run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", base=base,
        out=tmp_path / "two")
    one, two = tmp_path / "one", tmp_path / "two"

    def read(folder: Path, name: str) -> list | np.ndarray | str:
        path = folder / name
        return {".json": lambda: json.loads(path.read_text()), ".npy": lambda: np.load(path),
                ".txt": path.read_text}[path.suffix]()

    # the static table: 2 batches x 4 epochs, every rank the global batch's loss, as one process
    single, ranks = read(one, "loss0.json"), [read(two, f"loss{r}.json") for r in (0, 1)]
    assert len(single) == 8 and ranks[0] == ranks[1]
    assert_close(torch.tensor(ranks[0]), torch.tensor(single), rtol=1e-5, atol=1e-6)
    t0, t1 = read(two, "table0.npy"), read(two, "table1.npy")
    assert np.array_equal(t0, t1)                                   # identical steps on both ranks
    assert_close(torch.from_numpy(t0), torch.from_numpy(read(one, "table0.npy")), rtol=0, atol=1e-6)
    folder = one_checkpoint(two / "enc", "m2v-trained-", {read(two, f"folder{r}.txt") for r in (0, 1)})
    saved = StaticModel.from_pretrained(str(folder / "model")).embedding
    assert np.array_equal(np.asarray(saved, dtype=np.float32), t0)   # the file is what every rank holds

    # the transformer: 2 batches x 2 epochs with warm-up, partner column, uneven shards
    single, ranks = read(one, "tloss0.json"), [read(two, f"tloss{r}.json") for r in (0, 1)]
    assert len(single) == 4 and ranks[0] == ranks[1]
    assert_close(torch.tensor(ranks[0]), torch.tensor(single), rtol=1e-5, atol=1e-6)
    w0, w1, w = (np.load(p / f"weights{r}.npz") for p, r in ((two, 0), (two, 1), (one, 0)))
    assert sorted(w0) == sorted(w1) == sorted(w)
    for k in w0:
        assert np.array_equal(w0[k], w1[k]), k                      # both ranks hold the same weights
        # the attention keys' bias has no gradient in exact arithmetic (a softmax ignores a constant added to
        # a row of logits): AdamW turns the float noise into steps of ~lr, so it agrees only loosely
        atol = 1e-4 if k.endswith("attention.self.key.bias") else 1e-6
        assert_close(torch.from_numpy(w0[k]), torch.from_numpy(w[k]), rtol=1e-5, atol=atol, msg=k)
    folder = one_checkpoint(two / "enc", "finetuned-", {read(two, f"tfolder{r}.txt") for r in (0, 1)})
    # the file holds the ranks' weights (the model's own names, without sentence-transformers' module prefix)
    saved = load_file(str(folder / "model.safetensors"))
    held = {k.split(".", 2)[2]: v for k, v in w0.items() if k.startswith("0.")}                # 0.model.*
    assert saved and all(np.array_equal(v, held[k]) for k, v in saved.items())

    # one batch's gradient, summed over the ranks, is the single process's (its scale too), an empty shard too
    g0, g1, g = read(two, "grad0.npy"), read(two, "grad1.npy"), read(one, "grad0.npy")
    assert np.array_equal(g0, g1) and np.abs(g).sum() > 0
    assert_close(torch.from_numpy(g0), torch.from_numpy(g), rtol=1e-5, atol=1e-7)

