"""Validation at the edge (tracer.core.validate): every bad input of issue 11 gets an error that names where,
before any work: the native loader (file, line, record, field), the Retriever (argument and field),
and the evaluate.py / train.py overrides."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from builders import ROOT, TINY_TOOLS, KeywordEmbedder, call, result, tiny_trajectories
from hydra import compose, initialize_config_dir

from tracer.core.errors import DataError
from tracer.core.types import Registry
from tracer.data import load_native, write_native
from tracer.jobs import train as train_job
from tracer.jobs.evaluate import run_job
from tracer.retriever import Retriever

USER = {"role": "user", "content": "Find a flight and book it"}


@pytest.fixture
def dataset(tmp_path):
    """A native dataset directory; ``dataset(line)`` appends one trajectory given as a dict (or raw bytes)."""
    d = tmp_path / "ds"
    write_native(d, Registry(TINY_TOOLS), tiny_trajectories())

    def add(obj) -> Path:
        with open(d / "trajectories.jsonl", "ab") as f:
            f.write(obj if isinstance(obj, bytes) else (json.dumps(obj) + "\n").encode())
        return d
    return add


def traj(messages, **kw) -> dict:
    return {"id": "bad", "group": "bad", "domain": "tiny", "messages": messages, **kw}


def with_args(args) -> dict:
    m = call("search_flights", 9)
    m["tool_calls"][0]["function"]["arguments"] = args
    return m


# line 6: the five tiny trajectories come first
BAD_LINES = [
    (traj([{"role": "user", "content": 5}]), "messages[0].content",
     "must be a string, null or a list of content parts"),
    (traj([{"role": "user", "content": "\ud800 hi"}]), "messages[0].content",
     "lone surrogate '\\\\ud800' at character 0"),
    (traj([{"role": "user", "content": [{"type": "text", "text": 3}]}]), "messages[0].content[0].text",
     "must be a string"),
    (traj([USER, with_args({"a": 1})]), "messages[1].tool_calls[0].function.arguments",
     "must be a JSON string encoding an object .* got a dict"),
    (traj([USER, with_args("[1, 2]")]), "messages[1].tool_calls[0].function.arguments",
     "must encode a JSON object, got a list"),
    (traj([USER, with_args("5")]), "messages[1].tool_calls[0].function.arguments",
     "must encode a JSON object, got a int"),
    (traj([USER, with_args(7)]), "messages[1].tool_calls[0].function.arguments",
     "must be a JSON string .* got a int"),
    (traj([USER, with_args("{oops")]), "messages[1].tool_calls[0].function.arguments", "not valid JSON"),
    (traj([USER, call("search_flights", 0), result(7)]), "messages[2].tool_call_id",
     "'c7' answers no earlier tool call"),
    (traj([USER, {"role": "tool", "content": "x"}]), "messages[1].tool_call_id",
     "None answers no earlier tool call"),
    (traj([USER, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
     "messages[1].tool_calls[0].function.name", "tool call without a function name"),
    (traj([USER, call("teleport", 0)]), "messages[1].tool_calls[0].function.name",
     "names 'teleport', which is not in the registry"),
    (traj([{"role": "robot", "content": "x"}]), "messages[0].role", "must be one of"),
    (traj([USER], reward=float("nan")), "reward", "reward must be a finite number, got nan"),
    (traj([USER], reward=float("inf")), "reward", "reward must be a finite number, got inf"),
    (traj([USER], id=""), "id", "must be a non-empty string"),
    (traj([USER], group="  "), "group", "must be a non-empty string"),
]


@pytest.mark.parametrize(("obj", "field", "problem"), BAD_LINES,
                         ids=[f[1] + ":" + f[2][:20] for f in BAD_LINES])
def test_native_loader_names_file_line_and_field(dataset, obj, field, problem):
    d = dataset(obj)
    with pytest.raises(DataError,
                       match=rf"trajectories.jsonl, line 6, .*field '{re.escape(field)}': {problem}") as e:
        load_native(d)
    assert e.value.line == 6 and e.value.field == field


def test_accepted_argument_forms_and_content_parts(dataset):
    ok = traj([{"role": "user",
                "content": [{"type": "text", "text": "find a flight"}, {"type": "image_url"}]},
               with_args(""), result(9), with_args('{"to": "JFK"}'), result(9), with_args(None)])
    ok["messages"][-1]["tool_calls"][0]["function"].pop("arguments")
    ds = load_native(dataset(ok))
    assert [s.gold_arguments for s in ds.steps() if s.trajectory_id == "bad"] == [{}, {"to": "JFK"}, {}]


def test_non_utf8_bytes_name_the_byte_offset_and_line(dataset):
    line = b'{"id": "x", "group": "x", "domain": "d", "messages": [{"role": "user", "content": "caf\xe9"}]}\n'
    d = dataset(line)
    offset = (d / "trajectories.jsonl").stat().st_size - len(line) + line.index(b"\xe9")
    with pytest.raises(DataError,
                       match=rf"trajectories.jsonl, line 6: not UTF-8: byte 0xe9 at byte offset {offset}$"):
        load_native(d)
    tools = b'[\n{"type": "function", "function": {"name": "\xff"}}]'
    (d / "tools.json").write_bytes(tools)
    at = tools.index(b"\xff")
    with pytest.raises(DataError, match=rf"tools.json, line 2: not UTF-8: byte 0xff at byte offset {at}$"):
        load_native(d)


# ---- the Retriever ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny") / "ds"
    write_native(d, Registry(TINY_TOOLS), tiny_trajectories())
    return Retriever.from_dataset(d, "tracer_fixed", embedder=KeywordEmbedder(), device="cpu")


@pytest.mark.parametrize(("k", "error", "msg"), [(-1, ValueError, "got -1"), (0, ValueError, "got 0"),
                                                 (-5, ValueError, "got -5"),
                                                 (2.5, TypeError, r"got 2.5 \(float\)"),
                                                 ("3", TypeError, r"got '3' \(str\)"),
                                                 (True, TypeError, r"got True \(bool\)")])
def test_k_must_be_a_positive_int_everywhere(retriever, k, error, msg):
    msgs = [USER]
    for f in (lambda: retriever.select(msgs, k=k), lambda: retriever.select_batch([msgs], k=k),
              lambda: Retriever(retriever.scorer, k=k)):
        with pytest.raises(error, match=rf"^k must be an int >= 1, {msg}"):
            f()


def test_k_larger_than_the_registry_presents_the_registry(retriever):
    msgs = [USER, call("search_flights", 0), result(0)]
    names = retriever.rank(msgs)
    assert [t["function"]["name"] for t in retriever.select(msgs, k=100)] == names
    assert [[t["function"]["name"] for t in ts] for ts in retriever.select_batch([msgs], k=100)] == [names]


@pytest.mark.parametrize(("messages", "msg"), [
    ("find a flight", "messages: must be a list of message dicts, got str"),
    (None, "messages: must be a list of message dicts, got NoneType"),
    ([USER, {"role": "assistant", "tool_calls": [{"function": {}}]}],
     r"messages\[1\].tool_calls\[0\].function.name: tool call without a function name"),
    ([USER, "hello"], r"messages\[1\]: must be a dict, got str"),
    ([{"content": "hi"}], r"messages\[0\].role: must be a string, got NoneType"),
])
def test_messages_that_cannot_be_read_are_named(retriever, messages, msg):
    for f in (retriever.select, retriever.rank, retriever.select_ids):
        with pytest.raises(ValueError, match=msg):
            f(messages)
    with pytest.raises(ValueError, match="conversations\\[1\\]" + msg.removeprefix("messages")):
        retriever.select_batch([[USER], messages])


@pytest.mark.parametrize(("live", "tidy"), [
    ([{"role": "developer", "content": "Be brief"}, USER], [{"role": "system", "content": "Be brief"}, USER]),
    ([{"role": "user", "content": 5}], [{"role": "user", "content": "5"}]),
    ([USER, with_args("{oops"), result(9)], [USER, with_args("{}"), result(9)]),
    # results: not rendered
    ([USER, result(7), call("search_flights", 0)], [USER, call("search_flights", 0)]),
])
def test_a_live_conversation_the_dataset_rules_refuse_is_ranked_as_its_tidy_reading(retriever, live, tidy):
    """The dataset loader refuses these records (BAD_LINES); a live call ranks them (tracer.core.live)."""
    assert retriever.rank(live) == retriever.rank(tidy)
    assert retriever.select(live, k=3) == retriever.select(tidy, k=3)
    assert retriever.select_batch([live, tidy], k=3) == [retriever.select(tidy, k=3)] * 2
    assert retriever.read(live).lenient and not retriever.read(tidy).lenient


# ---- evaluate.py / train.py overrides ---------------------------------------------------------------------
@pytest.mark.parametrize(("override", "msg"), [
    ("k=0", r"k \(override k=...\) must be an int >= 1, got 0"),
    ("k=2.5", r"k \(override k=...\) must be an int >= 1, got 2.5"),
    ("folds=1", r"folds \(override folds=...\) must be an int >= 2, got 1"),
    ("seed=-3", r"seed \(override seed=...\) must be an int >= 0, got -3"),
])
def test_evaluate_overrides_are_checked_before_any_work(override, msg, tmp_path):
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("evaluate",
                      overrides=["dataset=jsonl", f"dataset.path={tmp_path / 'nowhere'}", override])
    with pytest.raises((ValueError, TypeError), match=msg):
        run_job(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_evaluate_cli_k_minus_one_fails_with_the_override_named(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "k=-1",
                          f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode != 0
    assert "k (override k=...) must be an int >= 1, got -1" in out.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_train_folds_are_checked(tmp_path):
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["dataset=jsonl", f"dataset.path={tmp_path / 'nowhere'}", "folds=1"])
    with pytest.raises(ValueError, match=r"folds \(override folds=...\) must be 0 .* or >= 2, got 1"):
        train_job.run_job(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
