"""A saved index is one self-contained folder: it carries its encoders (tracer/encode/bundle.py), so a copy
loads in a fresh process from another directory with every cache deleted and selects bit for bit as the
original; a damaged encoder file is refused naming it; saving again hard-links the encoder instead of copying
it.

Real components: train.py through Hydra, the static encoder trained from MiniLM's distillation, a fine-tuned
transformer served by ONNX Runtime in int8, FAISS, real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from builders import ROOT, TINY_TOOLS, tiny_trajectories

from tracer.core.errors import DataError
from tracer.core.store import CorruptIndex, current_snapshot
from tracer.core.types import Registry
from tracer.data import write_native
from tracer.encode.manifest import ArtifactMismatch
from tracer.retriever import Retriever

EXAMPLE = ROOT / "data" / "example"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}


def conversations() -> list[list[dict]]:
    """Live conversations over data/example's six tools, mid-task and at a turn's start."""

    def call(i: int, name: str) -> list[dict]:
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"},
        ]

    flight = {"role": "user", "content": "Find a flight from SFO to JFK and book it"}
    return [
        [flight],
        [flight, *call(0, "search_flights")],
        [{"role": "user", "content": "What's the weather?"}],
        [{"role": "user", "content": "email the files to Ann"}, *call(0, "list_files")],
        [
            flight,
            *call(0, "search_flights"),
            *call(1, "book_flight"),
            {"role": "user", "content": "cancel that booking please"},
        ],
    ]


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


def answers(r: Retriever) -> dict:
    return {
        "answers": [
            {"select": list(r.select_ids(m)), "rank": r.rank(m), "vec": r.context_embedding(m).tolist()}
            for m in conversations()
        ],
        "encoders": [r.res.embedder.name] + ([r.res.slow.embedder.name] if r.res.slow is not None else []),
    }


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


def linked_distillation(enc: Path) -> None:
    """MiniLM's model2vec distillation (the static recipes' start, built once in .cache/encoders) linked into
    a fresh encoder folder, so deleting that folder deletes every trained encoder and no shared one."""
    from tracer.encode.static import distilled

    start = distilled().resolve()
    enc.mkdir(parents=True)
    (enc / start.name).symlink_to(start)


def test_train_py_writes_an_index_that_loads_from_a_copy_with_every_cache_deleted(tmp_path):
    """The issue's command on data/example: preset/fastest through train.py; then the caches go and a copy of
    the index, loaded from another directory in a fresh process, selects, ranks and embeds bit for bit
    alike."""
    enc, emb, run = tmp_path / "enc", tmp_path / "emb", tmp_path / "run"
    linked_distillation(enc)
    cmd = [
        sys.executable,
        "train.py",
        "experiment=preset/fastest",
        "dataset=jsonl",
        f"dataset.path={EXAMPLE}",
        "folds=0",
        f"encoder_training.encoder_dir={enc}",
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


@pytest.fixture(scope="module")
def static_index(tmp_path_factory):
    """A tracer_plus index over a static table trained on data/example, saved once; its encoder cache
    deleted."""
    tmp = tmp_path_factory.mktemp("static_index")
    linked_distillation(tmp / "enc")
    recipe = {
        "context": {"join_users": True},
        "successful_only": True,
        "base_model": None,
        "device": "cpu",
        "encoder_dir": str(tmp / "enc"),
        "kind": "static",
        "batch_size": 4,
        "lr": 1e-2,
        "warmup": 0.0,
        "weight_decay": 0.0,
        "epochs": 1,
        "scale": 20.0,
        "max_seq_length": 512,
        "seed": 0,
    }
    r = Retriever.from_dataset(
        EXAMPLE,
        device="cpu",
        cache_dir=None,
        encoder_training=recipe,
        head={"max_epochs": 5, "inner_folds": 2},
    )
    r.save(tmp / "index")
    shutil.rmtree(tmp / "enc")
    return tmp / "index"


def _copy(index: Path, tmp_path: Path) -> tuple[Path, Path]:
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    return copy, copy / "snapshots" / current_snapshot(copy)


def test_a_flipped_byte_in_a_carried_encoder_file_is_refused_naming_the_file(static_index, tmp_path):
    index, snap = _copy(static_index, tmp_path)
    table = next((snap / "encoders").rglob("model.safetensors"))
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 0x01
    table.write_bytes(bytes(data))
    with pytest.raises(CorruptIndex, match=f"{table.name}: SHA-256 does not match the manifest") as e:
        Retriever.load(index, device="cpu")
    assert e.value.path == str(table)
    # unverified by the snapshot's manifest, the encoder's own manifest still names it
    with pytest.raises(ArtifactMismatch, match="model.safetensors: SHA-256 differs from the manifest"):
        Retriever.load(index, device="cpu", verify="none")


def test_a_carried_folder_must_lie_inside_the_snapshot(static_index, tmp_path):
    index, snap = _copy(static_index, tmp_path)
    meta = json.loads((snap / "meta.json").read_text())
    for bad, problem in (
        ("../../../elsewhere", "outside the snapshot"),
        ("encoders/missing", "missing"),
        (7, "embedder.files"),
    ):
        meta["embedder"]["files"] = bad
        (snap / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(DataError, match=problem):
            Retriever.load(index, device="cpu", verify="none")


def test_saving_again_links_the_carried_encoder_and_the_old_snapshot_may_go(static_index, tmp_path):
    """An update saved by the process that loaded the index (tracer update) hard-links the encoder's files
    from the current snapshot (same inodes, nothing copied); collecting the old snapshot leaves the new one
    whole."""
    index, first = _copy(static_index, tmp_path)
    r = Retriever.load(index, device="cpu")
    before = answers(r)
    r.save(index)
    second = index / "snapshots" / current_snapshot(index)
    assert second != first
    old = {p.relative_to(first): p.stat().st_ino for p in (first / "encoders").rglob("*") if p.is_file()}
    new = {p.relative_to(second): p.stat().st_ino for p in (second / "encoders").rglob("*") if p.is_file()}
    assert old == new and old  # the same folder id and the very same files
    r.save(index)
    r.save(index)  # the first snapshot is collected (keep=2)
    assert not first.exists()
    assert answers(Retriever.load(index, device="cpu")) == before
    vec = np.asarray(before["answers"][0]["vec"], dtype=np.float32)
    assert vec.shape == (r.res.embedder.dim,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-5


def test_tracer_select_answers_from_the_index_as_the_retriever_does(static_index, tmp_path):
    """``tracer select`` in a fresh process: the tools a copy of the index presents, one JSON line per
    conversation, equal to the retriever's; input that is not JSON is named with its line (exit 2)."""
    index, _ = _copy(static_index, tmp_path)
    r = Retriever.load(index, device="cpu")
    cmd = [sys.executable, "-m", "tracer.cli", "select", "--index", str(index), "--json", "--k", "3"]
    proc = subprocess.run(
        cmd,
        check=False,
        input=json.dumps(conversations()),
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [json.loads(line)["tools"] for line in proc.stdout.splitlines()]
    assert got == [[r.registry[i].name for i in r.select_ids(m, k=3)] for m in conversations()]
    (tmp_path / "bad.json").write_text('[{"role": "user",\n "content": }]')
    proc = subprocess.run(
        [*cmd[:-3], "--messages", str(tmp_path / "bad.json")],
        check=False,
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and f"{tmp_path / 'bad.json'}:2: not JSON" in proc.stderr
