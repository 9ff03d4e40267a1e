"""Public tool-retrieval corpora (tracer/data/corpora/): BFCL's single-turn categories from the installed
bfcl-eval, and Seal-Tools / APIBench read from real git clones (a checkout and a bare clone) laid out as the
upstream repositories are."""

from __future__ import annotations

import json

import pytest
from builders import SEAL_TOOLS_FILES, git, git_repo, jsonl

from tracer.core.errors import DataError
from tracer.data.corpora import BFCL_SINGLE, Clone, apibench, bfcl_single, read_corpus, seal_tools, sgd

GORILLA = {
    "data/apibench/torchhub_train.json": jsonl(
        {"code": "{'Instruction': I need depth from one image., 'Output': {'domain': 'x'}}",
         "api_data": {"api_name": "MiDaS v2", "functionality": "Relative depth",
                      "description": "From one image"}},
        {"code": "no instruction here", "api_data": {"api_name": "Skipped"}}),
    "data/apibench/huggingface_eval.json": jsonl(
        {"code": "###Instruction: Recommend similar articles.\n###Output: <<<domain>>>: NLP",
         "api_data": {"api_name": "princeton-nlp/unsup-simcse", "functionality": "Feature Extraction"}}),
}


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory):
    """A checkout of Seal-Tools and a bare clone of gorilla (as the fetch tool leaves it: owner+name/repo)."""
    root = tmp_path_factory.mktemp("mirrors")
    git_repo(root / "fairyshine+Seal-Tools", SEAL_TOOLS_FILES)
    work = git_repo(root / "work-gorilla", GORILLA)
    git("clone", "-q", "--bare", str(work), str(root / "ShishirPatil+gorilla" / "repo"), cwd=root)
    return root


def test_seal_tools_pairs_each_request_with_the_known_tools_it_calls_once_each(mirrors):
    got = list(seal_tools(mirrors))
    assert [(e.id, e.query, [t.name for t in e.golds]) for e in got] == [
        ("dev-0", "Tell me the water quality of the lake.", ["getWaterQuality"]),
        ("dev-1", "Customs of QKE and the lake's water", ["getCustomsInfo", "getWaterQuality"]),
    ]
    assert got[0].golds[0].search_text == "getWaterQuality: Get the water quality of a lake"  # spaces folded
    assert {e.corpus for e in got} == {"seal_tools"}


def test_apibench_reads_both_instruction_formats_from_a_bare_clone(mirrors):
    assert Clone(mirrors, "ShishirPatil/gorilla").files("data/apibench") == [
        "data/apibench/huggingface_eval.json", "data/apibench/torchhub_train.json"]
    got = list(apibench(mirrors))
    assert [(e.query, e.golds[0].name, e.golds[0].description) for e in got] == [
        ("Recommend similar articles.", "huggingface_princeton-nlp_unsup-simcse", "Feature Extraction."),
        ("I need depth from one image.", "torchhub_MiDaS_v2", "Relative depth. From one image"),
    ]


def test_a_missing_clone_or_tool_file_is_named(tmp_path, mirrors):
    with pytest.raises(DataError, match=r"fairyshine\+Seal-Tools.*no clone of fairyshine/Seal-Tools"):
        list(seal_tools(tmp_path))
    git_repo(tmp_path / "fairyshine+Seal-Tools", {"README.md": "x"})
    with pytest.raises(DataError, match=r"tool.jsonl.*missing or without a tool"):
        list(seal_tools(tmp_path))
    with pytest.raises(ValueError, match="unknown corpus 'toolbench'"):
        read_corpus("toolbench", mirrors)


def test_bfcl_single_turn_questions_with_their_ground_truth_functions():
    got = list(bfcl_single())
    by_id = {e.id: e for e in got}
    assert len(got) == len(by_id) >= 2400  # every category of BFCL_SINGLE, ids unique
    first = by_id["simple_python_0"]
    assert [t.name for t in first.golds] == ["calculate_triangle_area"]
    assert "base" in first.query and "height" in first.query
    # a parallel question names two functions of its ground truth, each once
    assert any(len(e.golds) >= 2 and len({t.name for t in e.golds}) == len(e.golds) for e in got)
    # the gold of a "multiple" question is one of several offered functions: the one the answer calls
    assert all(len(e.golds) == 1 for e in got if e.id.startswith("multiple_"))
    assert {e.id.rsplit("_", 1)[0] for e in got} == set(BFCL_SINGLE)  # every category gives requests


def test_a_line_that_is_not_json_is_named_with_its_file_and_line(tmp_path):
    bad = {**SEAL_TOOLS_FILES, "Seal-Tools_Dataset/dev.jsonl": '{"id": "a"}\n{oops\n'}
    git_repo(tmp_path / "fairyshine+Seal-Tools", bad)
    with pytest.raises(DataError, match=r"dev.jsonl, line 2.*not valid JSON"):
        list(seal_tools(tmp_path))


def _sgd_turn(speaker: str, text: str, *frames: dict) -> dict:
    return {"speaker": speaker, "utterance": text, "frames": list(frames)}


def _state(service: str, intent: str) -> dict:
    return {"service": service, "state": {"active_intent": intent}}


def _call(service: str, method: str) -> dict:
    return {"service": service, "service_call": {"method": method, "parameters": {}}}


SGD_SCHEMA = [{"service_name": "Restaurants_1", "slots": [
    {"name": "city", "description": "City of the  restaurant"}, {"name": "time", "description": "When"}],
    "intents": [{"name": "FindRestaurants", "description": "Find restaurants", "required_slots": ["city"],
                 "optional_slots": {}},
                {"name": "ReserveRestaurant", "description": "Reserve a table", "required_slots": ["city"],
                 "optional_slots": {"time": "19:00"}}]}]
SGD_DIALOGUE = {"dialogue_id": "1_00000", "turns": [
    _sgd_turn("USER", "I want to eat in San Jose.", _state("Restaurants_1", "FindRestaurants")),
    _sgd_turn("SYSTEM", "Found one.", _call("Restaurants_1", "FindRestaurants")),
    _sgd_turn("USER", "Book it for   two.", _state("Restaurants_1", "ReserveRestaurant")),
    _sgd_turn("SYSTEM", "Confirm?"),
    _sgd_turn("USER", "Yes, that's right.", _state("Restaurants_1", "ReserveRestaurant")),
    _sgd_turn("SYSTEM", "Booked.", _call("Restaurants_1", "ReserveRestaurant"),
              _call("Restaurants_1", "ReserveRestaurant"), _call("Flights_9", "BookFlight")),
]}


def test_sgd_pairs_each_call_with_the_user_turn_that_opened_its_intent(tmp_path):
    """The request, not the confirmation just before the call; a call twice in one turn counts once, and a
    call of an intent no schema lists is skipped; the sgd_x variants are not read."""
    git_repo(tmp_path / "google-research-datasets+dstc8-schema-guided-dialogue", {
        "train/schema.json": json.dumps(SGD_SCHEMA), "train/dialogues_001.json": json.dumps([SGD_DIALOGUE]),
        "dev/schema.json": json.dumps(SGD_SCHEMA), "sgd_x/v1/train/dialogues_001.json": "not read"})
    got = list(sgd(tmp_path))
    assert [(e.id, e.query, [t.name for t in e.golds]) for e in got] == [
        ("1_00000-1", "I want to eat in San Jose.", ["FindRestaurants"]),
        ("1_00000-5", "Book it for two.", ["ReserveRestaurant"]),
    ]
    reserve = got[1].golds[0]
    assert reserve.source == "Restaurants_1"
    assert reserve.parameters["properties"] == {"city": {"description": "City of the restaurant"},
                                                "time": {"description": "When"}}


def test_a_bad_sgd_file_is_named(tmp_path):
    root = tmp_path / "google-research-datasets+dstc8-schema-guided-dialogue"
    git_repo(root, {"train/schema.json": "[]", "README.md": "x"})
    with pytest.raises(DataError, match=r"train/schema.json.*without a service intent"):
        list(sgd(tmp_path))
    git_repo(tmp_path / "b" / root.name, {"train/schema.json": json.dumps(SGD_SCHEMA),
                                          "dev/dialogues_002.json": "[{oops"})
    with pytest.raises(DataError, match=r"dev/dialogues_002.json.*not JSON"):
        list(sgd(tmp_path / "b"))
    git_repo(tmp_path / "c" / root.name, {"train/schema.json": json.dumps([{"intents": []}])})
    with pytest.raises(DataError, match=r"schema.json.*service 0: malformed \(KeyError: 'service_name'\)"):
        list(sgd(tmp_path / "c"))
    bad_turn = json.dumps([SGD_DIALOGUE, {"turns": [3]}])  # the second dialogue's turn is no object
    git_repo(tmp_path / "d" / root.name, {"train/schema.json": json.dumps(SGD_SCHEMA),
                                          "test/dialogues_001.json": bad_turn})
    with pytest.raises(DataError, match=r"test/dialogues_001.json.*dialogue 1: malformed \(AttributeError"):
        list(sgd(tmp_path / "d"))
