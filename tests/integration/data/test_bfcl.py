"""BFCL multi-turn loader, on the installed bfcl_eval data: sizes, registry and groups, the conversations'
structure, and the parsing of gold calls. Their execution and the environment: test_bfcl_execution.py."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

pytest.importorskip("bfcl_eval")

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

from tracer.core.errors import DataError
from tracer.core.steps import extract_steps, iter_calls, turns_of
from tracer.data.bfcl import MISSING_FUNCTION_PROMPT, CallBinder, convert_schema, load_registry, parse_call
from tracer.data.bfcl_backends import FAMILY_OF

FAMILY_SIZES = {"gorilla_file_system": 18, "math_api": 17, "message_api": 10, "posting_api": 14,
                "ticket_api": 9, "trading_bot": 20, "travel_booking": 18, "vehicle_control": 22}


def user_turn_steps(traj, turn):
    return [s for s in extract_steps(traj) if s.turn == turn]


# --- sizes, registry, groups ------------------------------------------------------------------

def test_sizes_and_registry(ds):
    assert ds.executable
    assert len(ds.trajectories) == 800
    assert Counter(t.metadata["category"] for t in ds.trajectories) == {
        "base": 200, "miss_func": 200, "miss_param": 200, "long_context": 200}
    assert len(ds.registry) == 128
    assert Counter(t.source for t in ds.registry) == FAMILY_SIZES
    assert not any(t.name.startswith(("memory_", "search_engine", "fetch_url")) for t in ds.registry)


def test_families_match_bfcl_mapping():
    for class_name, family in FAMILY_OF.items():
        assert MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name] == f"{family}.json"
    assert MISSING_FUNCTION_PROMPT == DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC


def _types(schema):
    if isinstance(schema, dict):
        if isinstance(schema.get("type"), str):
            yield schema["type"]
        for v in schema.values():
            yield from _types(v)
    elif isinstance(schema, list):
        for v in schema:
            yield from _types(v)


def test_registry_schemas_are_json_schema():
    reg = load_registry()
    assert {t for tool in reg for t in _types(dict(tool.parameters))} <= {
        "object", "string", "number", "integer", "boolean", "array"}
    assert all(tool.parameters["type"] == "object" for tool in reg)
    cd = reg.get("cd")
    assert cd.source == "gorilla_file_system" and cd.parameters["required"] == ["folder"]
    assert cd.to_openai()["function"]["parameters"]["properties"]["folder"]["type"] == "string"


def test_convert_schema():
    bfcl = {"type": "dict", "properties": {
        "x": {"type": "float", "default": 1.5},
        "v": {"type": "any", "description": "anything"},
        "xs": {"type": "array", "items": {"type": "dict", "properties": {"n": {"type": "integer"}}}},
        "t": {"type": "tuple", "items": {"type": "boolean"}}}, "required": ["x"]}
    assert convert_schema(bfcl) == {"type": "object", "properties": {
        "x": {"type": "number", "default": 1.5},
        "v": {"description": "anything"},
        "xs": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        "t": {"type": "array", "items": {"type": "boolean"}}}, "required": ["x"]}
    with pytest.raises(DataError, match="unknown BFCL type 'complex'"):
        convert_schema({"type": "dict", "properties": {"z": {"type": "complex"}}}, "f.json", "f.parameters")


def test_groups_span_categories(ds, by_id):
    assert by_id["multi_turn_base_7"].group == by_id["multi_turn_miss_func_7"].group == "bfcl-7"
    groups = defaultdict(list)
    for t in ds.trajectories:
        groups[t.group].append(t.metadata["category"])
    assert len(groups) == 200
    assert all(sorted(c) == ["base", "long_context", "miss_func", "miss_param"] for c in groups.values())


def test_metadata_and_domain(by_id):
    t = by_id["multi_turn_base_0"]
    assert t.domain == "GorillaFileSystem+TwitterAPI"
    assert t.success and t.reward == 1.0
    md = t.metadata
    assert md["category"] == "base" and md["bfcl_id"] == t.id and not md["long_context"]
    assert md["involved_classes"] == ["TwitterAPI", "GorillaFileSystem"]
    assert "GorillaFileSystem" in md["initial_config"] and md["excluded_function"] == ["cp"]
    assert md["ground_truth"][2] == ["sort('final_report.pdf')"]
    assert by_id["multi_turn_long_context_0"].metadata["long_context"]
    json.dumps(t.to_json())  # writable in the native format


# --- conversation structure ---------------------------------------------------------------------

def test_turn_with_34_calls(by_id):
    t = by_id["multi_turn_long_context_38"]
    names = [c.split("(")[0] for c in t.metadata["ground_truth"][0]]
    assert len(names) == 34
    steps = user_turn_steps(t, 0)
    assert [s.gold for s in steps] == names
    for k, s in enumerate(steps):
        assert s.position == k and s.prefix == tuple(names[:k]) and s.history == tuple(names[:k])
    nxt = user_turn_steps(t, 1)
    assert [s.gold for s in nxt] == ["ls"] and nxt[0].position == 0 and nxt[0].prefix == ()
    assert nxt[0].history == tuple(names)
    assert max(len(calls) for calls in turns_of(t)) == 34


def test_one_call_per_assistant_message_then_its_result(by_id):
    msgs = by_id["multi_turn_base_0"].messages
    assert msgs[0]["role"] == "user" and all(m["role"] != "system" for m in msgs)
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            (call,) = m["tool_calls"]
            assert msgs[i + 1]["role"] == "tool" and msgs[i + 1]["tool_call_id"] == call["id"]
    assert msgs[1]["tool_calls"][0]["id"] == "multi_turn_base_0-t0-c0"
    assert msgs[3]["tool_calls"][0]["id"] == "multi_turn_base_0-t0-c1"


def test_miss_func_added_turn_opens_a_turn(by_id):
    t = by_id["multi_turn_miss_func_0"]
    assert t.metadata["missed_function"] == {"3": ["sort"]}
    users = [m for m in t.messages if m["role"] == "user"]
    assert len(users) == 5 and users[3]["content"] == MISSING_FUNCTION_PROMPT
    assert user_turn_steps(t, 2) == []  # sort was asked for while it was missing
    (step,) = user_turn_steps(t, 3)
    assert step.gold == "sort" and step.position == 0 and step.prefix == ()
    assert step.gold_arguments == {"file_name": "final_report.pdf"}  # positional argument named
    assert [s.gold for s in user_turn_steps(t, 4)] == ["cd", "mv", "cd", "diff"]


def test_miss_param_clarification_turn_has_no_steps(by_id):
    t = by_id["multi_turn_miss_param_0"]
    assert t.metadata["ground_truth"][3] == []
    assert user_turn_steps(t, 3) == []
    assert ([m["content"] for m in t.messages if m["role"] == "user"][4]
            == "The specific file is previous_report.pdf.")
    assert (user_turn_steps(t, 4)[0].gold, user_turn_steps(t, 4)[0].position) == ("cd", 0)
    assert len(turns_of(t)) == 5


def test_every_call_is_a_registry_tool_with_the_gold_arguments(ds):
    bind = CallBinder()
    for t in ds.trajectories:
        calls = list(iter_calls(t.messages))
        gold = [c for turn in t.metadata["ground_truth"] for c in turn]
        assert len(calls) == len(gold)
        for (_, _, name, args), text in zip(calls, gold):
            assert name in ds.registry
            fname, pos, kw = parse_call(text)
            assert (name, args) == (fname, json.loads(json.dumps(bind(fname, pos, kw))))
            assert set(args) <= set(ds.registry.get(name).parameters["properties"])


# --- parsing -----------------------------------------------------------------------------------

def test_parse_call_literals():
    text = ("f('a, b (c)', x=[1, [2, -3.5]], y={'k': 'v), (w', 'n': [-1, {'d': None}]}, "
            "z=-7, s=\"it's (fine), ok\", b=True, e=[], t=(1, 2))")
    assert parse_call(text) == ("f", ("a, b (c)",), {
        "x": [1, [2, -3.5]], "y": {"k": "v), (w", "n": [-1, {"d": None}]}, "z": -7,
        "s": "it's (fine), ok", "b": True, "e": [], "t": (1, 2)})
    assert parse_call("ls()") == ("ls", (), {})
    assert (parse_call("  tail(file_name='log.txt',lines=20) ")
            == ("tail", (), {"file_name": "log.txt", "lines": 20}))


@pytest.mark.parametrize("bad", ["x + 1", "a.b(c=1)", "f(x=y)", "f(**kw)", "f(", "f(x=1)(2)"])
def test_parse_call_rejects(bad):
    with pytest.raises(ValueError):
        parse_call(bad)


def test_binder_names_positional_arguments():
    bind = CallBinder()
    assert bind("get_zipcode_based_on_city", ("Rivermist",), {}) == {"city": "Rivermist"}
    assert bind("cd", (), {"folder": "x"}) == {"folder": "x"}
    with pytest.raises(ValueError, match="do not fit"):
        bind("cd", ("a", "b"), {})
