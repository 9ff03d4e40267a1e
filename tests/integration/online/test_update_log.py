"""``tracer update`` and ``Retriever.update`` on logs (issue 32, defects 3, 4 and 11): each logged trajectory
is learned once however often the log is applied (the index keeps a ledger of applied ids, verified with its
snapshot), a bad line is reported with its file, line and field and skipped, and only tools the log's
trajectories call are registered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import TINY_TOOLS, KeywordEmbedder, call, fitted_scorer, result, tiny_trajectories

from tracer.build import build_scorer
from tracer.cli import main as tracer_cli
from tracer.core.errors import DataError
from tracer.core.store import CorruptIndex, current_snapshot
from tracer.core.types import Registry, Tool, Trajectory
from tracer.data import load_native, write_native
from tracer.online.incremental import scorer_tries
from tracer.retriever import Retriever
from tracer.scorer_base.resources import Resources


def counts(scorer) -> list[torch.Tensor]:
    """The trie's counts: what applying a trajectory twice would double."""
    (trie,) = scorer_tries(scorer)
    return [trie.edge_count.clone(), trie.node_count.clone(), trie.edge_tool.clone()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def renamed(t: Trajectory, tid: str) -> Trajectory:
    return Trajectory(tid, tid, t.domain, t.messages)


def cli(index: Path, log: Path, *extra: str) -> list[str]:
    return ["update", "--index", str(index), "--log", str(log), "--cache-dir", "", *extra]


def last_report(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


# ---- defect 4: applied once -----------------------------------------------------------------------------
@pytest.mark.heavy(seconds=8)
def test_updating_twice_from_the_same_log_learns_it_once_and_appended_lines_are_learned(
        tmp_path, static_minilm, capsys):
    trajs = tiny_trajectories()
    res = Resources.build(Registry(TINY_TOOLS), static_minilm, device="cpu")
    Retriever(fitted_scorer(build_scorer("tracer_fixed"), trajs[:3], res)).save(tmp_path / "index")
    write_native(tmp_path / "log", Registry(TINY_TOOLS), trajs[3:])
    cmd = [sys.executable, "-m", "tracer.cli", *cli(tmp_path / "index", tmp_path / "log")]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert first.returncode == 0, first.stderr
    once = counts(Retriever.load(tmp_path / "index", static_minilm).scorer)
    snapshot = current_snapshot(tmp_path / "index")
    # the same command again, in this process (the first ran as a user runs it)
    capsys.readouterr()
    assert tracer_cli(cli(tmp_path / "index", tmp_path / "log")) == 0
    assert (last_report(first.stdout)["trajectories"], last_report(first.stdout)["already_applied"]) == (2, 0)
    report = last_report(capsys.readouterr().out)
    assert (report["trajectories"], report["already_applied"], report["saved"]) == (0, 2, False)
    assert current_snapshot(tmp_path / "index") == snapshot  # a no-op: no new snapshot for replicas to reload
    assert same(counts(Retriever.load(tmp_path / "index", static_minilm).scorer), once)
    batch = fitted_scorer(build_scorer("tracer_fixed"), trajs, res)
    assert same(once, counts(batch))  # learned once: as a fit on the union
    # the gateway appends: the next update learns only the new lines
    new = [renamed(trajs[0], "n0"), renamed(trajs[2], "n1")]
    with open(tmp_path / "log" / "trajectories.jsonl", "a") as f:
        f.writelines(json.dumps(t.to_json()) + "\n" for t in new)
    assert tracer_cli(cli(tmp_path / "index", tmp_path / "log")) == 0
    report = last_report(capsys.readouterr().out)
    assert (report["trajectories"], report["already_applied"], report["saved"]) == (2, 2, True)
    union = fitted_scorer(build_scorer("tracer_fixed"), trajs + new, res)
    assert same(counts(Retriever.load(tmp_path / "index", static_minilm).scorer), counts(union))


def test_retriever_update_skips_applied_ids_and_the_ledger_is_saved_and_verified(tmp_path, tiny_resources):
    trajs = tiny_trajectories()
    r = Retriever(fitted_scorer(build_scorer("tracer_fixed"), trajs[:3], tiny_resources))
    first = r.update(trajs[3:])
    once = counts(r.scorer)
    again = r.update(trajs[3:])
    assert (first["trajectories"], first["already_applied"]) == (2, 0)
    assert (again["trajectories"], again["already_applied"], again["steps"]) == (0, 2, 0)
    assert same(counts(r.scorer), once)
    new = renamed(trajs[0], "n0")
    twice_in_one = r.update([new, new])  # one id twice in one batch: learned once
    assert (twice_in_one["trajectories"], twice_in_one["already_applied"]) == (1, 1)
    assert same(counts(r.scorer), counts(fitted_scorer(build_scorer("tracer_fixed"), trajs + [new],
                                                       tiny_resources)))
    r.save(tmp_path / "index")
    loaded = Retriever.load(tmp_path / "index", KeywordEmbedder())
    after = counts(loaded.scorer)
    assert loaded.update(trajs[3:] + [new])["already_applied"] == 3 and same(counts(loaded.scorer), after)
    # the ledger is one of the snapshot's files, checked against its manifest like the others
    snap = tmp_path / "index" / "snapshots" / current_snapshot(tmp_path / "index")
    ledger = snap / "applied.npy"
    data = bytearray(ledger.read_bytes())
    data[-1] ^= 0xFF
    ledger.chmod(0o644)
    ledger.write_bytes(bytes(data))
    with pytest.raises(CorruptIndex, match="applied.npy"):
        Retriever.load(tmp_path / "index", KeywordEmbedder())


# ---- defects 3 and 11: a bad line is skipped and reported; only called tools are registered ------------
NEW_TOOL = Tool("email_booking", "Email the booking confirmation to the user")


def test_bad_lines_are_reported_and_skipped_and_only_called_tools_are_registered(tmp_path, minilm, capsys):
    trajs = tiny_trajectories()
    res = Resources.build(Registry(TINY_TOOLS), minilm, device="cpu")
    r = Retriever(fitted_scorer(build_scorer("tracer_fixed"), trajs[:3], res))
    r.save(tmp_path / "index")
    snapshot = current_snapshot(tmp_path / "index")
    bad_args = call("get_weather", 0)
    bad_args["tool_calls"][0]["function"]["arguments"] = '{"city": "Par'
    uses_new = Trajectory("n2", "n2", "tiny", ({"role": "user", "content": "Book and email it"},
                                                call("book_flight", 0), result(0), call("email_booking", 1),
                                                result(1)))
    lines = [
        json.dumps(trajs[3].to_json()),                                                     # 1 ok
        "{not json",                                                                        # 2
        json.dumps({**trajs[4].to_json(), "id": "a1", "messages": [bad_args]}),             # 3
        json.dumps({**trajs[4].to_json(), "id": "a2", "reward": float("nan")}),             # 4 (NaN)
        json.dumps({**trajs[4].to_json(), "id": "a3", "messages": [call("teleport", 0)]}),  # 5 unknown tool
        json.dumps(trajs[3].to_json()),                                                     # 6 duplicate id
        "",                                                                                 # 7 blank
        json.dumps(uses_new.to_json()),                                                     # 8 ok, a new tool
        json.dumps(trajs[4].to_json()),                                                     # 9 ok
    ]
    log = tmp_path / "log"
    log.mkdir()
    offered = [*TINY_TOOLS, NEW_TOOL,
               *(Tool(f"never_called_{i}", "offered, never called") for i in range(50))]
    (log / "tools.json").write_text(json.dumps([t.to_openai() for t in offered]))
    (log / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    problems: list = []
    lenient = load_native(log, problems=problems)  # the same reading from Python
    assert [t.id for t in lenient.trajectories] == ["t3", "n2", "t4"] and lenient.skipped == {"bad_lines": 5}
    assert [(p.line, p.field) for p in problems] == [
        (2, None), (3, "messages[0].tool_calls[0].function.arguments"), (4, "reward"),
        (5, "messages[0].tool_calls[0].function.name"), (6, "id")]
    with pytest.raises(DataError, match=r"trajectories.jsonl, line 2: not valid JSON"):
        load_native(log)  # strict, the default for datasets
    assert tracer_cli(cli(tmp_path / "index", log, "--strict")) == 2  # today's behaviour, on request
    assert str(log / "trajectories.jsonl") in capsys.readouterr().err
    assert current_snapshot(tmp_path / "index") == snapshot
    assert tracer_cli(cli(tmp_path / "index", log)) == 0
    report = last_report(capsys.readouterr().out)
    assert (report["trajectories"], report["skipped"], report["new_tools"]) == (3, 5, 1)
    path = log / "trajectories.jsonl"
    where = [p.split(": ")[:2] for p in report["problems"]]
    assert where == [[f"{path}:2", "-"], [f"{path}:3", "messages[0].tool_calls[0].function.arguments"],
                     [f"{path}:4", "reward"], [f"{path}:5", "messages[0].tool_calls[0].function.name"],
                     [f"{path}:6", "id"]]
    assert "not valid JSON" in report["problems"][0] and "'teleport'" in report["problems"][3]
    loaded = Retriever.load(tmp_path / "index", minilm)
    assert list(loaded.registry.names) == [t.name for t in TINY_TOOLS] + ["email_booking"]
    # a log with nothing valid in it: exit 1, nothing saved
    (log / "trajectories.jsonl").write_text("{not json\n")
    snapshot = current_snapshot(tmp_path / "index")
    assert tracer_cli(cli(tmp_path / "index", log)) == 1
    assert (last_report(capsys.readouterr().out)["skipped"] == 1
            and current_snapshot(tmp_path / "index") == snapshot)
    np.testing.assert_array_equal(loaded.res.tool_index.vectors,
                                  Retriever.load(tmp_path / "index", minilm).res.tool_index.vectors)
