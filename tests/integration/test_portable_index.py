"""A saved index is one self-contained folder: it carries its encoders (tracer/encode/bundle.py), so a copy
loads in a fresh process from another directory with every cache deleted and selects bit for bit as the
original (train.py's index, and a cascade's two encoders). A damaged encoder file, hard links on saving
again and ``tracer select`` on a copy: test_carried_encoders.py.

Real components: train.py through Hydra, the static encoder trained from MiniLM's distillation (MiniLM with
its word pieces cut to 6,000 in the default test), a fine-tuned transformer served by ONNX Runtime in int8,
FAISS, real processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from builders import ROOT, TINY_TOOLS, tiny_trajectories
from index_probes import ENV, EXAMPLE, answers, conversations, linked_distillation

from tracer.core.store import current_snapshot
from tracer.core.types import Registry
from tracer.data import write_native
from tracer.retriever import Retriever

# a fresh interpreter in another working directory: loads the index and prints what it selects, ranks and
# embeds
PROBE = textwrap.dedent("""
    import json, sys
    from tracer import Retriever
    r = Retriever.load(sys.argv[1], device="cpu")
    out = [{"select": list(r.select_ids(m)), "rank": r.rank(m), "vec": r.context_embedding(m).tolist()}
           for m in json.loads(sys.argv[2])]
    print(json.dumps({"answers": out, "encoders": [r.res.embedder.name]
                      + ([r.res.slow.embedder.name] if r.res.slow is not None else [])}))
""")


def probe_elsewhere(index: Path, tmp_path: Path) -> dict:
    """Copy ``index`` to a new folder and load the copy in a fresh process whose working directory is
    empty."""
    copy, cwd = tmp_path / "elsewhere" / "copied_index", tmp_path / "empty_cwd"
    shutil.copytree(index, copy)
    cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(copy), json.dumps(conversations())],
        check=False,
        cwd=cwd,
        env={**ENV, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not any(cwd.iterdir()), "loading wrote into the working directory"
    return json.loads(proc.stdout.splitlines()[-1])


def tiny_variants(path: Path) -> Path:
    """The five tiny conversations (data/example's tools), three variants each: 15 groups."""
    trajs = [
        replace(t, id=f"{t.id}-{v}", group=f"{t.group}-{v}") for v in range(3) for t in tiny_trajectories()
    ]
    return write_native(path, Registry(TINY_TOOLS), trajs)


@pytest.mark.heavy(seconds=60)
def test_train_py_writes_an_index_that_loads_from_a_copy_with_every_cache_deleted(tmp_path, minilm_small):
    """The issue's command on data/example: preset/fastest through train.py (its static table started from
    MiniLM with fewer word pieces, whose distillation takes seconds); then the caches go and a copy of the
    index, loaded from another directory in a fresh process, selects, ranks and embeds bit for bit alike."""
    enc, emb, run = tmp_path / "enc", tmp_path / "emb", tmp_path / "run"
    linked_distillation(enc, minilm_small)
    cmd = [
        sys.executable,
        "train.py",
        "experiment=preset/fastest",
        "dataset=jsonl",
        f"dataset.path={EXAMPLE}",
        "folds=0",
        f"encoder_training.encoder_dir={enc}",
        f"encoder_training.base_model={minilm_small}",
        f"embedder.cache_dir={emb}",
        "device=cpu",
        f"hydra.run.dir={run}",
    ]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["preset"] == "preset/fastest" and report["heldout"] is None
    assert report["index"]["parts"]["encoders"] > 0 and report["seconds"]["encoder"] > 0
    assert "It carries its encoders" in (run / "report.md").read_text()

    original = Retriever.load(run / "index", device="cpu")
    assert original.res.embedder.name.startswith("m2v-trained-")
    expected = answers(original)
    shutil.rmtree(enc)
    shutil.rmtree(emb, ignore_errors=True)
    assert probe_elsewhere(run / "index", tmp_path) == expected


@pytest.mark.slow  # trains two encoders and exports one: make test-all
def test_a_cascade_index_carries_both_encoders_the_onnx_one_without_its_unused_graph(tmp_path):
    """Both stages' encoders travel with a cascade: the fast stage's static table and the slow stage's
    fine-tuned transformer as it is served, the ONNX int8 graph and tokenizer (not the fp32 graph it was
    quantised from)."""
    enc = tmp_path / "enc"
    linked_distillation(enc)
    common = {
        "context": {"join_users": True},
        "successful_only": True,
        "base_model": None,
        "device": "cpu",
        "encoder_dir": str(enc),
        "batch_size": 6,
        "warmup": 0.1,
        "weight_decay": 0.0,
        "epochs": 1,
        "scale": 20.0,
        "seed": 0,
    }
    onnx = {
        "_target_": "tracer.encode.onnx.OnnxEmbedder",
        "variant": "int8",
        "threads": 1,
        "encoder_dir": str(enc),
    }
    recipe = {
        **common,
        "kind": "static",
        "lr": 1e-2,
        "max_seq_length": 512,
        "slow": {**common, "lr": 1e-4, "max_seq_length": 48, "layers": [5], "serve_as": onnx},
    }
    head = {"head": {"max_epochs": 10, "inner_folds": 2}}
    r = Retriever.from_dataset(
        tiny_variants(tmp_path / "data"),
        "cascade",
        device="cpu",
        cache_dir=None,
        encoder_training=recipe,
        fast=head,
        slow=head,
        escalate=0.5,
    )
    assert "-onnx-int8-" in r.res.slow.embedder.name
    r.save(tmp_path / "index")
    snap = tmp_path / "index" / "snapshots" / current_snapshot(tmp_path / "index")
    carried = sorted(p.relative_to(snap / "encoders").as_posix() for p in (snap / "encoders").rglob("*.onnx"))
    assert len(carried) == 1 and carried[0].endswith("/int8.onnx")  # the served graph only
    expected = answers(r)
    shutil.rmtree(enc)
    assert probe_elsewhere(tmp_path / "index", tmp_path) == expected
