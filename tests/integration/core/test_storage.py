"""Index storage (tracer.core.store): snapshots behind an atomic pointer, verified on load, never deleting
what is not ours; with real files and real processes (a concurrent writer and reader, SIGKILL mid-save)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import storage_worker as w
from builders import ROOT, TESTS

from tracer.core.io import write_json
from tracer.core.store import MANIFEST, CorruptIndex, current_snapshot
from tracer.scorers.tracer import TracerScorer

WORKER = TESTS / "storage_worker.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def variants():
    scorers = [w.build(i) for i in range(w.N_VARIANTS)]
    return scorers, [w.fingerprint(s) for s in scorers]


def spawn(*jobs: tuple[str, Path, float]) -> list[subprocess.Popen]:
    """Start workers together (their imports overlap), wait until each is ready, then let them all go."""
    procs = [subprocess.Popen([sys.executable, str(WORKER), mode, str(d), str(sec)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for mode, d, sec in jobs]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return procs


def snapshot_dir(root: Path) -> Path:
    return root / "snapshots" / current_snapshot(root)


# ---- atomic for readers -----------------------------------------------------------------------------------
@pytest.mark.heavy(seconds=10)
def test_concurrent_writers_and_reader_every_load_is_one_saved_index(variants, tmp_path):
    scorers, prints = variants
    scorers[0].save(tmp_path / "ix")
    *writers, reader = spawn(("write", tmp_path / "ix", 3.0), ("write", tmp_path / "ix", 3.0),
                             # two writers at once failed with ENOTEMPTY before
                             ("read", tmp_path / "ix", 2.5))
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    for wr in writers:
        _, werr = wr.communicate(timeout=60)
        assert wr.returncode == 0, werr[-2000:]
    loads = [json.loads(line) for line in out.splitlines()]
    errors = [x["error"] for x in loads if "error" in x]
    assert not errors, errors[:3]                          # never "no saved index", never a mixture refused
    seen = {x["ok"] for x in loads}
    assert seen <= set(prints), "a load matched none of the saved indexes"
    assert len(loads) >= 5 and len(seen) >= 2             # the reader did overlap with the writer's saves
    assert len(list((tmp_path / "ix" / "snapshots").iterdir())) <= 5  # old snapshots are collected


def test_sigkill_during_save_leaves_old_or_new_index_and_next_save_cleans_up(variants, tmp_path):
    scorers, prints = variants
    root = tmp_path / "ix"
    scorers[0].save(root)
    rng = random.Random(0)
    for writer in spawn(*[("write", root, 60.0)] * 3):  # three concurrent writers, killed one by one
        time.sleep(rng.uniform(0.05, 0.6))
        writer.send_signal(signal.SIGKILL)
        writer.communicate(timeout=30)
        loaded = TracerScorer.load(root, w.KeywordEmbedder(), device="cpu")
        assert w.fingerprint(loaded) in prints
    scorers[1].save(root)  # the dead writers' temporaries are ours by prefix and their pids are gone
    leftovers = [p.name for d in (root, root / "snapshots")
                 for p in d.iterdir() if p.name.startswith((".tmp-", ".del-"))]
    assert leftovers == []
    assert w.fingerprint(TracerScorer.load(root, w.KeywordEmbedder(), device="cpu")) == prints[1]


# ---- what save never deletes ------------------------------------------------------------------------------
def test_save_refuses_foreign_targets_and_deletes_nothing(variants, tmp_path):
    scorer = variants[0][0]
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a directory"):
        scorer.save(tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match=r"not empty and not a tracer index \(holds thesis.tex\)"):
        scorer.save(tmp_path / "work")
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["thesis.tex"]


def test_save_into_the_working_directory(variants, tmp_path, monkeypatch):
    scorers, prints = variants
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    scorers[0].save(".")
    scorers[2].save(".")  # a second save must not try to rename "." away (EBUSY before)
    assert w.fingerprint(TracerScorer.load(".", w.KeywordEmbedder(), device="cpu")) == prints[2]
    assert sorted(p.name for p in Path(".").iterdir()) == [".tracer-index", "CURRENT", "snapshots"]
    assert len(list(Path("snapshots").iterdir())) == 2    # the current one and the previous one


# ---- integrity --------------------------------------------------------------------------------------------
def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name",
                         ["tool_vectors.npy", "trie.pt", "tools.json", "meta.json", "tools_idmap.json"])
def test_a_flipped_byte_is_detected_and_named(variants, tmp_path, name):
    variants[0][0].save(tmp_path / "ix")
    flip_last_byte(snapshot_dir(tmp_path / "ix") / name)
    with pytest.raises(CorruptIndex, match=rf"{name}: SHA-256 does not match the manifest"):
        TracerScorer.load(tmp_path / "ix", w.KeywordEmbedder(), device="cpu")


def test_a_flipped_edge_memory_value_is_detected(variants, tmp_path):
    """A float inside the trie's edge-memory tensor, made 1e29: loads silently before the manifest."""
    import torch

    scorer = variants[0][0]
    scorer.save(tmp_path / "ix")
    path = snapshot_dir(tmp_path / "ix") / "trie.pt"
    raw = bytearray(path.read_bytes())
    mem = scorer.trie.state_dict()["edge_memory"].contiguous().numpy().tobytes()
    at = bytes(raw).find(mem[:64])
    assert at > 0
    raw[at:at + 4] = torch.tensor([1e29]).numpy().tobytes()
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptIndex, match="trie.pt: SHA-256 does not match"):
        TracerScorer.load(tmp_path / "ix", w.KeywordEmbedder(), device="cpu")
    # the fast mode
    loaded = TracerScorer.load(tmp_path / "ix", w.KeywordEmbedder(), device="cpu", verify="size")
    assert loaded.trie.state_dict()["edge_memory"].max() == pytest.approx(1e29)


def test_truncated_and_unparsable_files_are_named_even_without_verification(variants, tmp_path):
    variants[0][0].save(tmp_path / "ix")
    snap = snapshot_dir(tmp_path / "ix")
    (snap / "trie.pt").write_bytes((snap / "trie.pt").read_bytes()[:200])
    with pytest.raises(CorruptIndex, match=r"trie.pt: size 200 bytes, the manifest says \d+"):
        TracerScorer.load(tmp_path / "ix", w.KeywordEmbedder(), device="cpu")
    with pytest.raises(CorruptIndex, match="trie.pt: torch cannot read it"):
        TracerScorer.load(tmp_path / "ix", w.KeywordEmbedder(), device="cpu", verify="none")
    cases = {"meta.json": ("{not json", r"meta.json, line 1: not valid JSON"),
             "tools.json": ('{"a": 1}', "tools.json: not a list of OpenAI tool objects"),
             "tools_idmap.json": ("[1, 2]", r"tools_idmap.json: expected \{'factory'"),
             "tool_vectors.npy": ("garbage", "tool_vectors.npy: numpy cannot read it")}
    for name, (text, msg) in cases.items():
        variants[0][0].save(tmp_path / name)
        (snapshot_dir(tmp_path / name) / name).write_text(text)
        with pytest.raises(CorruptIndex, match=msg):
            TracerScorer.load(tmp_path / name, w.KeywordEmbedder(), device="cpu", verify="none")
    variants[0][0].save(tmp_path / "noemb")
    meta = snapshot_dir(tmp_path / "noemb") / "meta.json"
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "embedder"}))
    with pytest.raises(CorruptIndex, match="meta.json, field 'embedder': missing or malformed"):
        TracerScorer.load(tmp_path / "noemb", w.KeywordEmbedder(), device="cpu", verify="none")


def test_missing_index_and_manifest_contents(variants, tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved index here"):
        TracerScorer.load(tmp_path / "nothing", w.KeywordEmbedder())
    variants[0][0].save(tmp_path / "ix")
    snap = snapshot_dir(tmp_path / "ix")
    files = json.loads((snap / MANIFEST).read_text())["files"]
    assert set(files) == {p.name for p in snap.iterdir()} - {MANIFEST}
    assert all(files[n]["size"] == (snap / n).stat().st_size for n in files)


# ---- permissions ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_created_files_follow_the_umask(variants, tmp_path, umask, file_mode, dir_mode):
    from tracer.data import write_native
    from tracer.encode.embedders import CachedEmbedder

    old = os.umask(umask)
    try:
        variants[0][0].save(tmp_path / "ix")
        write_json(tmp_path / "run" / "metrics.json", {"a": 1})
        write_native(tmp_path / "ds", w.build(0).res.registry, w.tiny_trajectories())
        CachedEmbedder(w.KeywordEmbedder(), tmp_path / "cache").encode(["a flight"])
    finally:
        os.umask(old)
    snap = snapshot_dir(tmp_path / "ix")
    files = [tmp_path / "ix" / "CURRENT", tmp_path / "ix" / ".tracer-index", snap / MANIFEST,
             snap / "trie.pt",
             tmp_path / "run" / "metrics.json", tmp_path / "ds" / "tools.json",
             tmp_path / "ds" / "trajectories.jsonl", *(tmp_path / "cache").rglob("*.npz")]
    assert len(files) == 8
    assert {str(f): oct(f.stat().st_mode & 0o777) for f in files} == {str(f): oct(file_mode) for f in files}
    for d in (snap, tmp_path / "ix" / "snapshots", tmp_path / "ds"):
        assert oct(d.stat().st_mode & 0o777) == oct(dir_mode), d
