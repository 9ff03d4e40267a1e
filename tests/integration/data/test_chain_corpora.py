"""The corpora of call chains (tracer/data/corpora/chains.py): NESTFUL's nested sequences and ToolLinkOS's
tools after the tools they depend on, read from real git clones laid out as the upstream repositories are."""

from __future__ import annotations

import json

import pytest
from builders import git_repo

from tracer.core.errors import DataError
from tracer.data.corpora import nestful, read_corpus, toollinkos

NESTFUL_DIR = "data/non-executable/non-executable"
GLAIVE_SPEC = [
    {"name": "calculate_age", "description": "Calculate the  age", "query_parameters": {
        "birthdate": {"type": "string", "required": True, "description": "The birthdate"}},
     "output_parameters": {"age": {"type": "integer"}}},
    {"name": "generate_password", "description": "A random password", "query_parameters": {}},
]
GLAIVE_DATA = [
    {"input": "Take my age,  then a password that long.", "output": [
        {"name": "calculate_age", "arguments": {"birthdate": "1990-08-25"}, "label": "var1"},
        {"name": "generate_password", "arguments": {"length": "$var1.age$"}, "label": "var2"},
        {"name": "calculate_age", "arguments": {"birthdate": "1991-01-01"}, "label": "var3"},
        {"name": "not_in_the_spec", "arguments": {}, "label": "var4"},
        {"name": "var_result", "arguments": {"password": "$var2$"}}]},
    {"input": "", "output": [{"name": "calculate_age", "arguments": {}}]},  # no request: skipped
]
SGD_SPEC = [{"name": "Hotels.Search", "description": "Find a hotel", "query_parameters": {}},
            {"name": "Hotels.Reserve", "description": "Book a hotel", "query_parameters": {}}]
SGD_DATA = [{"input": "Find and book a hotel.", "output": [
    {"name": "Hotels.Search", "arguments": {}, "label": "var1"},
    {"name": "Hotels.Reserve", "arguments": {"hotel": "$var1.name$"}, "label": "var2"}]}]


def _nestful(root, data=GLAIVE_DATA):
    git_repo(root / "IBM+NESTFUL", {
        f"{NESTFUL_DIR}-glaive-spec.json": json.dumps(GLAIVE_SPEC),
        f"{NESTFUL_DIR}-glaive-data.json": json.dumps(data),
        f"{NESTFUL_DIR}-sgd-spec.json": json.dumps(SGD_SPEC),
        f"{NESTFUL_DIR}-sgd-data.json": json.dumps(SGD_DATA),
        # the RapidAPI part: never read
        "data/executable/executable-data.json": "not read", "data/executable/executable-spec.json": "x"})


def test_nestful_keeps_each_call_in_order_without_the_result_and_never_reads_the_rapidapi_part(tmp_path):
    _nestful(tmp_path)
    got = list(nestful(tmp_path))
    assert [(e.id, e.query, [t.name for t in e.golds]) for e in got] == [
        # called twice, so twice; a function the spec lacks and the assembled result are left out
        ("glaive-0", "Take my age, then a password that long.",
         ["calculate_age", "generate_password", "calculate_age"]),
        ("sgd-0", "Find and book a hotel.", ["Hotels.Search", "Hotels.Reserve"]),
    ]
    age = got[0].golds[0]
    assert (age.description, age.source) == ("Calculate the age", "nestful_glaive")
    assert age.parameters["properties"] == {"birthdate": {"description": "The birthdate"}}
    assert read_corpus("nestful", tmp_path) == got


def test_a_malformed_nestful_sequence_is_named_with_its_file_and_place(tmp_path):
    _nestful(tmp_path, [*GLAIVE_DATA, {"input": "no output"}])
    with pytest.raises(DataError, match=r"non-executable-glaive-data.json.*sequence 2: malformed \(KeyError"):
        list(nestful(tmp_path))
    _nestful(tmp_path / "b", {"not": "an array"})
    with pytest.raises(DataError, match=r"glaive-data.json.*expected a JSON array, got dict"):
        list(nestful(tmp_path / "b"))
    with pytest.raises(DataError, match=r"no clone of IBM/NESTFUL"):
        list(nestful(tmp_path / "c"))


def _tool(name: str, *depends: tuple[str, str]) -> dict:
    return {"name": name, "description": f"does {name}", "parameters": [
        {"name": "x", "type": "string", "description": f"x of {name}", "required": True}],
        "depends_on": [{"name": d, "dependence_type": kind} for d, kind in depends]}


PARAM, TOOL = "PARAMETER_DIRECTLY_DEPENDS_ON", "TOOL_DIRECTLY_DEPENDS_ON"
REGULAR = [
    _tool("share_location", ("validate_email", PARAM), ("get_location", PARAM), ("set_wifi", TOOL)),
    _tool("get_location", ("get_location_status", PARAM)),
    _tool("validate_email"),
    _tool("loop_a", ("loop_b", PARAM)), _tool("loop_b", ("loop_a", PARAM)),
]
CORE = [_tool("set_wifi"), _tool("get_location_status")]
INSTANCES = [
    {"user_query": "Send my location to  bob@example.com", "main_golden_function_name": "share_location",
     "golden_function_names": ["share_location", "set_wifi", "get_location", "validate_email",
                               "get_location_status"]},
    # a dependency outside the gold set is not called; a cycle is cut
    {"user_query": "Loop", "main_golden_function_name": "loop_a",
     "golden_function_names": ["loop_a", "loop_b"]},
    {"user_query": "Where am I?", "main_golden_function_name": "get_location",
     "golden_function_names": ["get_location"]},
]


def _toollinkos(root, instances=INSTANCES, regular=REGULAR):
    git_repo(root / "EliasLumer+Graph-RAG-Tool-Fusion-ToolLinkOS", {
        "toollinkos/regular_tools.json": json.dumps(regular), "toollinkos/core_tools.json": json.dumps(CORE),
        "toollinkos/instances.json": json.dumps(instances)})


def test_toollinkos_calls_the_main_tool_after_what_fills_its_parameters_depth_first(tmp_path):
    _toollinkos(tmp_path)
    got = list(toollinkos(tmp_path))
    assert [(e.id, e.query, [t.name for t in e.golds]) for e in got] == [
        # the parameters' producers first, each after its own; "the wifi must be on" is not a call it needs
        ("0", "Send my location to bob@example.com",
         ["validate_email", "get_location_status", "get_location", "share_location"]),
        ("1", "Loop", ["loop_b", "loop_a"]),
        ("2", "Where am I?", ["get_location"]),
    ]
    assert got[0].golds[-1].parameters == {"type": "object", "properties": {
        "x": {"description": "x of share_location"}}}
    assert {t.source for e in got for t in e.golds} == {"toollinkos"}


def test_a_malformed_toollinkos_record_is_named_with_its_file_and_place(tmp_path):
    _toollinkos(tmp_path, [*INSTANCES, {"user_query": "no main"}])
    with pytest.raises(DataError, match=r"instances.json.*instance 3: malformed \(KeyError"):
        list(toollinkos(tmp_path))
    _toollinkos(tmp_path / "b", regular=[*REGULAR, {"description": "no name"}])
    with pytest.raises(DataError, match=r"regular_tools.json.*tool 5: malformed \(KeyError: 'name'\)"):
        list(toollinkos(tmp_path / "b"))
