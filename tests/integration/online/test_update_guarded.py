"""``tracer update`` as real processes against hostile logs (issue 56): a log reusing applied ids with other
content is learned and located (defects 10, 16), the log is read bounded (a device, a FIFO, an over-long line:
defect 11), and two updates at once both land (defect 14)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from builders import ROOT, TINY_TOOLS, call, fitted_scorer, result, tiny_trajectories

from tracer.build import build_scorer
from tracer.core.types import Registry, Tool, Trajectory
from tracer.data import write_native
from tracer.online.incremental import scorer_tries
from tracer.retriever import Retriever
from tracer.scorer_base.resources import Resources

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}


def counts(scorer) -> list[torch.Tensor]:
    (trie,) = scorer_tries(scorer)
    return [trie.edge_count.clone(), trie.node_count.clone(), trie.edge_tool.clone()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def batch_counts(trajectories: list[Trajectory], res: Resources) -> list[torch.Tensor]:
    """The counts of a fit on ``trajectories``: what learning each of them once gives."""
    return counts(fitted_scorer(build_scorer("tracer_fixed"), trajectories, res))


def update_cmd(index: Path, log: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tracer.cli", "update", "--index", str(index), "--log", str(log),
            "--cache-dir", "", *extra]


def run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout,
                          check=False)


def report_of(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def variant(t: Trajectory, tid: str) -> Trajectory:
    return replace(t, id=tid, group=tid)


@pytest.fixture(scope="module")
def base_index(tmp_path_factory, static_minilm):
    """An index fitted on t0-t2 that has applied t3 and t4 (a static MiniLM: the CLI loads it from the
    index)."""
    trajs = tiny_trajectories()
    res = Resources.build(Registry(TINY_TOOLS), static_minilm, device="cpu")
    r = Retriever(fitted_scorer(build_scorer("tracer_fixed"), trajs[:3], res))
    assert r.update(trajs[3:])["trajectories"] == 2
    path = tmp_path_factory.mktemp("update_guarded") / "index"
    r.save(path)
    return path, res


@pytest.fixture
def index(base_index, tmp_path) -> Path:
    shutil.copytree(base_index[0], tmp_path / "index")
    return tmp_path / "index"


# ---- defects 10 and 16: the ledger knows content as well as ids; every problem is file:line -------------
@pytest.mark.heavy(seconds=7)
def test_a_log_reusing_applied_ids_with_other_content_is_learned_and_every_line_is_located(base_index, index,
                                                                                         tmp_path,
                                                                                         static_minilm):
    """Before the fix the whole foreign log read ``already_applied`` (ids only) and the invented-tool line
    was reported as ``trajectories.jsonl:<id>`` (its id, and the wrong file)."""
    trajs = tiny_trajectories()
    foreign = variant(trajs[0], "t3")  # another log's t3: other content under an applied id
    invented = Trajectory("n9", "n9", "tiny", ({"role": "user", "content": "Teleport my files"},
                                               call("teleport", 0), result(0)),
                          metadata={"unoffered": ["teleport"]})
    log = tmp_path / "log"
    write_native(log, Registry([*TINY_TOOLS, Tool("teleport", "")]), [])
    segment = log / "trajectories-000001.jsonl"           # a rotated segment, read before trajectories.jsonl
    segment.write_text(json.dumps(trajs[4].to_json()) + "\n" + json.dumps(invented.to_json()) + "\n")
    (log / "trajectories.jsonl").write_text(json.dumps(foreign.to_json()) + "\n")

    proc = run(update_cmd(index, log))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = report_of(proc.stdout)
    assert (report["trajectories"], report["already_applied"], report["saved"]) == (1, 1, True)
    assert report["problems"] == [(f"{segment}:2: metadata.unoffered: calls teleport, which no request "
                                   "offered and the index lacks: not learned")]
    assert report.get("id_reused") == 1
    assert report.get("id_reused_at") == [f"{log / 'trajectories.jsonl'}:1: id 't3'"]
    assert "reuse an id the index applied with other content" in proc.stderr
    # learned once, as a fit on everything applied would count it
    union = [*trajs, variant(trajs[0], "t3-other")]
    loaded = Retriever.load(index, static_minilm)
    assert same(counts(loaded.scorer), batch_counts(union, base_index[1]))
    # the saved ledger holds both t3s: either is applied already
    again = loaded.update([foreign, trajs[3], trajs[4]])
    assert (again["trajectories"], again["already_applied"], again["id_reused"]) == (0, 3, 0)


# ---- defect 11: the log is read bounded ------------------------------------------------------------------
# one real process applies four logs in turn: a FIFO without a writer (its open used to block for ever),
# /dev/zero (one endless line: it used to grow by gigabytes), a small log (everything loaded once) and a log
# holding a 128 MiB line (it used to be read, decoded and parsed whole: +400 MB at the peak). The big update's
# memory is its peak (VmHWM, reset by clear_refs just before it) over the resident size before it.
BOUNDED = r"""
import json, sys
from pathlib import Path
from tracer.cli import main

index, fifo, small, big = sys.argv[1:5]


def update(log):
    rc = main(["update", "--index", index, "--log", log, "--cache-dir", ""])
    sys.stdout.flush()
    return rc


def mib(key):
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key + ":"))
    return int(line.split()[1]) / 1024


out = {"fifo": update(fifo), "zero": update("/dev/zero"), "small": update(small)}
Path("/proc/self/clear_refs").write_text("5")  # the peak resident size starts again from the current one
before = mib("VmRSS")
out["big"] = update(big)
out["big_mib"] = mib("VmHWM") - before
print("RESULT " + json.dumps(out))
"""
HUGE = 128 << 20


@pytest.mark.heavy(seconds=8)
def test_the_log_is_read_bounded_devices_fifos_and_over_long_lines(index, tmp_path):
    trajs = tiny_trajectories()
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps(variant(trajs[1], "s1").to_json()) + "\n")
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.write((json.dumps(variant(trajs[0], "b1").to_json()) + "\n").encode())
        head = b'{"id": "huge", "group": "huge", "domain": "tiny", "messages": [{"role": "user", "content": "'
        f.write(head + b"x" * (HUGE - len(head) - 5) + b'"}]}\n')
        f.write((json.dumps(variant(trajs[2], "b2").to_json()) + "\n").encode())
    proc = run([sys.executable, "-c", BOUNDED, str(index), str(fifo), str(small), str(big)], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert (out["fifo"], out["zero"], out["small"], out["big"]) == (2, 2, 0, 0)
    assert f"tracer update: {fifo}: is a FIFO: only a regular file is read" in proc.stderr
    assert "tracer update: /dev/zero: is a character device: only a regular file is read" in proc.stderr
    report = report_of(proc.stdout.split("RESULT ", 1)[0])
    assert (report["trajectories"], report["skipped"]) == (2, 1)
    assert report["problems"] == [f"{big}:2: -: {HUGE} bytes, over the line cap of 1048576 bytes: not read"]
    # the over-long line was never held: the update (a load and a save) grew by less than the line itself
    assert out["big_mib"] < HUGE >> 20, out


# ---- defect 14: two updates at once ----------------------------------------------------------------------
@pytest.mark.heavy(seconds=10)
def test_two_updates_at_once_both_land(base_index, index, tmp_path, static_minilm):
    """Two ``tracer update`` processes started together on one index, each with its own log. Each used to
    load the same snapshot and save its own on top: both said ``saved: true`` and the last rename dropped the
    other's trajectories. The second now waits for the first's lock and applies its log to what the first
    saved."""
    trajs = tiny_trajectories()
    logs = {side: [variant(trajs[i % 5], f"{side}{i}") for i in range(30)] for side in ("a", "b")}
    for side, log in logs.items():
        (tmp_path / f"{side}.jsonl").write_text("".join(json.dumps(t.to_json()) + "\n" for t in log))
    procs = [subprocess.Popen(update_cmd(index, tmp_path / f"{side}.jsonl"), cwd=ROOT, env=ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for side in logs]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert (report_of(out)["trajectories"], report_of(out)["saved"]) == (30, True)
    loaded = Retriever.load(index, static_minilm)
    both = [*logs["a"], *logs["b"]]
    assert loaded.update(both)["already_applied"] == 60          # the ledger holds both logs
    assert same(counts(loaded.scorer), batch_counts([*trajs, *both], base_index[1]))
