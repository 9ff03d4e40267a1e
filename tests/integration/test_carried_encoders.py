"""A saved index's carried encoder (a static table trained on data/example): a flipped byte is refused
naming the file, a carried folder must lie inside the snapshot, saving again hard-links the encoder and
the old snapshot may go; and ``tracer select`` on a copy answers as the retriever does."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from index_probes import ENV, EXAMPLE, answers, conversations, linked_distillation

from tracer.cli import main as tracer_cli
from tracer.core.errors import DataError
from tracer.core.store import CorruptIndex, current_snapshot
from tracer.encode.manifest import ArtifactMismatch
from tracer.retriever import Retriever


@pytest.fixture(scope="module")
def static_index(tmp_path_factory, minilm_small):
    """A tracer_plus index over a static table trained on data/example, saved once; its encoder cache
    deleted."""
    tmp = tmp_path_factory.mktemp("static_index")
    linked_distillation(tmp / "enc", minilm_small)
    recipe = {
        "context": {"join_users": True},
        "successful_only": True,
        "base_model": str(minilm_small),
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


@pytest.mark.heavy(seconds=15)
def test_tracer_select_answers_from_the_index_as_the_retriever_does(static_index, tmp_path, capsys,
                                                                    monkeypatch):
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
    # the command's other answers, from the same entry point in this process (one fresh process above is
    # the user's; two more would only pay the imports and the load again)
    (tmp_path / "bad.json").write_text('[{"role": "user",\n "content": }]')
    capsys.readouterr()
    assert tracer_cli([*cmd[3:-3], "--messages", str(tmp_path / "bad.json")]) == 2
    assert f"{tmp_path / 'bad.json'}:2: not JSON" in capsys.readouterr().err
    # the plain listing says what was read leniently (a role the index does not know is skipped, and counted)
    odd = [*conversations()[0], {"role": "critic", "content": "?"}]
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(odd)))
    assert tracer_cli([cmd[3], "--index", str(index), "--k", "3"]) == 0
    names = ", ".join(r.registry[i].name for i in r.select_ids(odd, k=3))
    assert capsys.readouterr().out == (f"[0] {odd[0]['content'][:100]!r} -> {names}  (read leniently: "
                                       "unknown_role 1)\n")
