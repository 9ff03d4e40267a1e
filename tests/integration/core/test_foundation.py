"""Records, step extraction, the native format (round trip and bad input), folds, context rendering, the
cache."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest
import torch
from builders import tool_call

from tracer.core.context import ContextRendering
from tracer.core.errors import DataError
from tracer.core.folds import assign_folds, kfold
from tracer.core.steps import extract_steps
from tracer.core.types import Registry, Tool, Trajectory
from tracer.data import load_dataset, load_native, write_native
from tracer.encode.embedders import CachedEmbedder

TWO_TURNS = Trajectory(id="x", group="g", domain="d", messages=(
    {"role": "system", "content": "be helpful"},
    {"role": "user", "content": "find and book"},
    {"role": "assistant", "content": None,
     "tool_calls": [tool_call("search", "1", q="a"), tool_call("weather", "2")]},
    {"role": "tool", "tool_call_id": "1", "content": "r1"},
    {"role": "tool", "tool_call_id": "2", "content": "r2"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("book", "3", id=7)]},
    {"role": "tool", "tool_call_id": "3", "content": "r3"},
    {"role": "assistant", "content": "done"},
    {"role": "user", "content": "now cancel"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("cancel", "4", id=7)]},
))


def test_steps_of_a_two_turn_conversation_with_parallel_calls():
    steps = extract_steps(TWO_TURNS)
    got = [(s.turn, s.position, s.prefix, s.history, s.gold, len(s.context), s.index, dict(s.gold_arguments))
           for s in steps]
    assert got == [
        (0, 0, (), (), "search", 2, 0, {"q": "a"}),
        # parallel: earlier call of the message in context
        (0, 1, ("search",), ("search",), "weather", 3, 1, {}),
        (0, 2, ("search", "weather"), ("search", "weather"), "book", 5, 2, {"id": 7}),
        # prefix resets at the user message
        (1, 0, (), ("search", "weather", "book"), "cancel", 9, 3, {"id": 7}),
    ]
    assert steps[1].context[-1]["tool_calls"] == [TWO_TURNS.messages[2]["tool_calls"][0]]
    assert steps[3].previous_call == "book" and steps[3].opens_turn


def test_registry_lookup_and_render():
    reg = Registry([Tool("a", "first"), Tool("b", "second")])
    assert reg.id("b") == 1 and "a" in reg and reg.names == ("a", "b")
    assert dict(reg.positions) == {"a": 0, "b": 1} and "zz" not in reg.positions
    with pytest.raises(TypeError):
        reg.positions["c"] = 2  # read-only: the registry's ids never change under it
    assert reg.to_openai(["b"]) == [{"type": "function", "function": {"name": "b", "description": "second",
                                                                      "parameters": {"type": "object",
                                                                                     "properties": {}}}}]
    with pytest.raises(ValueError, match="duplicate tool name 'a'"):
        Registry([Tool("a"), Tool("a")])
    with pytest.raises(KeyError, match="'zz' is not in the registry"):
        reg.id("zz")


def _registry():
    return Registry([Tool(n, f"tool {n}", {"type": "object", "properties": {"q": {"type": "string"}}})
                     for n in ("search", "weather", "book", "cancel")])


def test_native_round_trip(tmp_path):
    reg = _registry()
    trajs = [TWO_TURNS,
             Trajectory(id="y", group="g2", domain="d", messages=TWO_TURNS.messages[:3], reward=0.5,
                        success=False, metadata={"note": 1})]
    write_native(tmp_path / "ds", reg, trajs)
    ds = load_native(tmp_path / "ds")
    assert ds.registry == reg and ds.trajectories == tuple(trajs)
    assert load_dataset("jsonl", path=tmp_path / "ds").trajectories == tuple(trajs)
    write_native(tmp_path / "ds", reg, trajs[:1])  # rewriting replaces atomically
    assert len(load_native(tmp_path / "ds").trajectories) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def _write(tmp_path, tools=None, lines=None):
    d = tmp_path / "bad"
    d.mkdir(exist_ok=True)
    (d / "tools.json").write_text(json.dumps(_registry().to_openai() if tools is None else tools))
    ok = json.dumps(TWO_TURNS.to_json())
    (d / "trajectories.jsonl").write_text("\n".join([ok] if lines is None else lines) + "\n")
    return d


@pytest.mark.parametrize("lines, match", [
    (["{not json"], r"trajectories.jsonl, line 1: not valid JSON"),
    ([json.dumps({**TWO_TURNS.to_json(), "id": 3})], r"line 1, record 3, field 'id': missing or not a str"),
    ([json.dumps(TWO_TURNS.to_json()), json.dumps(TWO_TURNS.to_json())],
     r"line 2, record 'x', field 'id'.*duplicate"),
    ([json.dumps({**TWO_TURNS.to_json(), "messages": [
        {"role": "assistant", "tool_calls": [tool_call("teleport", "1")]}]})],
     r"line 1, record 'x', field 'messages\[0\].tool_calls\[0\].function.name': .*'teleport'"),
    ([json.dumps({**TWO_TURNS.to_json(), "messages": [{"role": "robot"}]})], r"field 'messages\[0\].role'"),
    ([json.dumps({**TWO_TURNS.to_json(), "success": "yes"})], r"field 'success'"),
    ([""], r"empty dataset"),
])
def test_bad_trajectories_name_file_line_and_field(tmp_path, lines, match):
    d = _write(tmp_path, lines=lines)
    with pytest.raises(DataError, match=match) as e:
        load_native(d)
    assert str(d / "trajectories.jsonl") in str(e.value)


def test_bad_tools_and_missing_directory(tmp_path):
    tools = _registry().to_openai()
    d = _write(tmp_path, tools=tools + [tools[0]])
    with pytest.raises(DataError,
                       match=r"tools.json, record '#4', field 'function.name': duplicate tool name 'search'"):
        load_native(d)
    d = _write(tmp_path, tools=[])
    with pytest.raises(DataError, match="empty registry"):
        load_native(d)
    with pytest.raises(DataError, match="dataset directory not found"):
        load_native(tmp_path / "nope")


def test_a_tools_toolkit_is_its_source_read_and_written_per_tool(tmp_path):
    reg = Registry([replace(t, source=s) for t, s in zip(_registry(), ("web", "web", "travel", ""))])
    write_native(tmp_path / "ds", reg, [TWO_TURNS])
    assert load_native(tmp_path / "ds").registry == reg           # the sources too (Tool equality)
    assert "source" not in json.loads((tmp_path / "ds" / "tools.json").read_text())[3]  # none: not written
    tools = reg.to_openai()
    d = _write(tmp_path, tools=tools[:1] + [{**tools[1], "source": 7}] + tools[2:])
    with pytest.raises(DataError, match=r"tools.json, record 'weather', field 'source': must be a string"):
        load_native(d)


def test_folds_never_split_a_group_and_are_stable():
    trajs = [Trajectory(id=f"{g}-{i}", group=f"g{g}", domain="d", messages=()) for g in range(23)
             for i in range(3)]
    splits = kfold(trajs, 5, seed=1)
    for sp in splits:
        assert not {t.group for t in sp.train} & {t.group for t in sp.test}
        assert len(sp.train) + len(sp.test) == len(trajs)
    assert sorted(t.id for sp in splits for t in sp.test) == sorted(t.id for t in trajs)  # each once
    groups = [t.group for t in trajs]
    assert assign_folds(groups, 5, 1) == assign_folds(list(reversed(groups)), 5, 1)
    assert assign_folds(groups, 5, 1) != assign_folds(groups, 5, 2)
    with pytest.raises(ValueError, match="cannot split 2 groups into 5 folds"):
        assign_folds(["a", "b"], 5)


def test_context_renderings():
    msgs = TWO_TURNS.messages[:7]
    assert ContextRendering(window="since_user").render(msgs) == (
        "user: find and book\nassistant: call search; call weather\nassistant: call book")
    full = ContextRendering(window="all", system=True, results="truncated", result_chars=1)
    assert full.render(msgs).splitlines()[:2] == ["system: be helpful", "user: find and book"]
    assert "result: r" in full.render(msgs)
    assert ContextRendering(window="last_n", n=2).render(msgs) == "assistant: call book"  # tool result hidden
    assert ContextRendering(window="last_n", n=3, order="newest_first", results="full").render(msgs) == (
        "result: r3\nassistant: call book\nresult: r2")
    assert ContextRendering(calls="names_args").render(msgs[:3]).endswith('call weather({})')
    with pytest.raises(ValueError, match="context window"):
        ContextRendering(window="everything")


def test_join_users_reads_an_unanswered_request_with_the_message_after_it():
    msgs = [{"role": "system", "content": "be helpful"}, {"role": "user", "content": "list files"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "content": "a.txt"}, {"role": "user", "content": "make a folder docs"},
            {"role": "user", "content": "What about now?"}]
    assert ContextRendering(window="since_user").render(msgs) == "user: What about now?"
    joined = ContextRendering(window="since_user", join_users=True)
    assert joined.render(msgs) == "user: make a folder docs\nuser: What about now?"
    # an answered turn stops the run: the earlier request and its call stay out
    assert joined.render(msgs[:5]) == "user: make a folder docs"
    assert joined.render(msgs + [{"role": "assistant", "tool_calls": [{"function": {"name": "mkdir"}}]}]) == (
        "user: make a folder docs\nuser: What about now?\nassistant: call mkdir")


class CountingEmbedder:
    name, dim = "counting", 4

    def __init__(self):
        self.calls = 0

    def encode(self, texts):
        self.calls += len(texts)
        return torch.nn.functional.normalize(torch.tensor([[len(t), 1.0, t.count("a"), 2.0] for t in texts]),
                                             dim=1)


def test_cache_second_run_encodes_nothing(tmp_path):
    # include a text whose 32-byte key ends in NUL bytes: numpy's fixed-width bytes would drop them
    nul = next(t for t in (f"text-{i}" for i in range(100000))
               if hashlib.sha256(b"counting\0" + t.encode()).digest()[-1] == 0)
    texts = ["alpha", "beta", "alpha", nul]
    first = CachedEmbedder(CountingEmbedder(), tmp_path)
    a = first.encode(texts)
    assert first.n_encoded == 3  # distinct texts only
    second = CachedEmbedder(CountingEmbedder(), tmp_path)
    b = second.encode(texts)
    assert second.n_encoded == 0 and second.inner.calls == 0
    assert torch.equal(a, b)
    assert not list(tmp_path.rglob("*.tmp"))


def test_real_minilm_is_normalised_and_cached(minilm):
    v = minilm.encode(["book a flight", "book a flight", "weather in Paris"])
    assert v.shape == (3, 384) and torch.allclose(v.norm(dim=1), torch.ones(3), atol=1e-5)
    assert torch.equal(v[0], v[1]) and float(v[0] @ v[2]) < 0.9
