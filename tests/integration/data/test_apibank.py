"""The API-Bank loader on the real data in ../shared/datasets/apibank (counts from its README)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from builders import call_names

from tracer.core.errors import DataError
from tracer.core.steps import iter_calls
from tracer.data import load_dataset
from tracer.data.apibank import SKIP_LV3_UNKNOWN_API, SKIP_NOT_PREFIX, SKIP_UNKNOWN_API, SKIP_UNPARSABLE
from tracer.data.apibank_request import RequestError, parse_request
from tracer.data.paths import repo_root

APIBANK = repo_root() / ".." / "shared" / "datasets" / "apibank"

pytestmark = pytest.mark.skipif(not APIBANK.is_dir(), reason="shared datasets not present")


def _distinct_items(level: int) -> dict[str, list[str]]:
    """Per dialogue file: the expected call names of its distinct items, shortest input first."""
    items = json.loads((APIBANK / "json_test_data" / f"level-{level}-api.json").read_text())
    by_file: dict[str, dict[str, str]] = {}
    for it in items:
        by_file.setdefault(it["file"], {})[it["input"]] = it["expected_output"]
    return {f: [out[len("API-Request: ["):].split("(")[0]
                for _, out in sorted(d.items(), key=lambda kv: len(kv[0]))]
            for f, d in by_file.items()}


@pytest.mark.parametrize("level, dialogues, steps", [(1, 212, 389), (2, 49, 119)])
def test_apibank_levels_1_2(level, dialogues, steps):
    # README: level 1 has 399 items from 212 dialogues, level 2 135 items from 49; 10 and 16 items
    # repeat an earlier item's input, so each distinct item is one call of its rebuilt dialogue.
    ds = load_dataset("apibank", levels=level)
    assert len(ds.trajectories) == dialogues and len(ds.steps()) == steps
    assert len(ds.registry) == 53 and dict(ds.skipped) == {}
    assert ds.domains() == [f"apibank-l{level}"]
    expected = _distinct_items(level)
    assert {t.group for t in ds.trajectories} == set(expected)
    for t in ds.trajectories:
        assert t.id == f"apibank-l{level}-{t.group.removesuffix('.jsonl')}"
        assert [n for _, _, n, _ in iter_calls(t.messages)] == expected[t.group]
        # the last call has no result
        assert t.messages[-1]["role"] == "assistant" and t.messages[-1]["tool_calls"]


def test_apibank_dialogue_messages():
    ds = load_dataset("apibank", levels=1)
    t = next(t for t in ds.trajectories
             if t.group == "ModifyRegistration-QueryHealthData-CancelRegistration-level-2-2.jsonl")
    roles = [m["role"] for m in t.messages]
    assert roles[:5] == ["user", "assistant", "user", "assistant", "assistant"]
    assert t.messages[0]["content"].startswith(
        "Can you please modify my appointment scheduled for March 25th")
    call = t.messages[4]["tool_calls"][0]["function"]
    assert call["name"] == "ModifyRegistration"
    assert json.loads(call["arguments"]) == {"appointment_id": "34567890",
                                             "new_appointment_date": "2023-03-26",
                                             "new_appointment_doctor": "Dr. Lee"}
    assert t.messages[5] == {"role": "tool", "tool_call_id": "call_0", "name": "ModifyRegistration",
                             "content": "success"}
    assert [n for _, _, n, _ in iter_calls(t.messages)] == ["ModifyRegistration", "QueryHealthData",
                                                             "CancelRegistration"]


def test_apibank_repaired_requests_keep_the_string():
    ds = load_dataset("apibank", levels=(1, 2))
    assert sum(t.metadata.get("repaired", 0) for t in ds.trajectories) == 40
    health = [s.gold_arguments["health_data"] for s in ds.steps() if s.gold == "RecordHealthData"]
    assert "[{'name': 'blood_pressure', 'value': '120/80'}, {'name': 'heart_rate', 'value': '80'}]" in health
    assert all(isinstance(h, str) for h in health)


def test_apibank_level_3():
    ds = load_dataset("apibank", levels=3)
    # README: 50 items, 131 real-API calls + 114 ToolSearcher calls, 22 tools in tools_lv3.json
    assert len(ds.trajectories) == 50 and len(ds.steps()) == 245 and len(ds.registry) == 22
    assert Counter(call_names(ds))["ToolSearcher"] == 114
    assert [t.group for t in ds.trajectories] == [f"lv3-{i}" for i in range(50)]
    first = ds.trajectories[0]
    assert first.id == "apibank-l3-0" and first.domain == "apibank-l3"
    assert first.messages[0] == {"role": "user",
                                 "content": "Query meeting of John and send email reminder to "
                                                            "john@example.com."}
    assert json.loads(first.messages[2]["content"])["name"] == "QueryMeeting"  # ToolSearcher's result
    assert (first.messages[-1]["role"] == "assistant"
            and first.messages[-1]["content"].startswith("For the meeting"))


def test_apibank_pooled_prefixes_level_3_collisions():
    ds = load_dataset("apibank")
    assert len(ds.trajectories) == 212 + 49 + 50 and len(ds.steps()) == 389 + 119 + 245
    assert len(ds.registry) == 53 + 22
    assert sorted(n for n in ds.registry.names if n.startswith("lv3__")) == [
        "lv3__AddMeeting", "lv3__Calculator", "lv3__QueryMeeting", "lv3__ToolSearcher"]
    assert ds.registry.get("lv3__QueryMeeting").source == "apibank-l3"
    assert ds.registry.get("QueryMeeting").source == "apibank"
    lv3 = Counter(s.gold for s in ds.steps() if s.trajectory_id.startswith("apibank-l3-"))
    assert lv3["lv3__ToolSearcher"] == 114 and lv3["lv3__AddMeeting"] == 5 and lv3["lv3__QueryMeeting"] == 5
    assert (lv3["lv3__Calculator"] == 4
            and not {"ToolSearcher", "AddMeeting", "QueryMeeting", "Calculator"} & set(lv3))
    lower = Counter(s.gold for s in ds.steps() if not s.trajectory_id.startswith("apibank-l3-"))
    assert not any(n.startswith("lv3__") for n in lower)
    assert lower == Counter(call_names(load_dataset("apibank", levels=(1, 2))))


def test_parse_request():
    assert parse_request("[A(x='1', y=[1, 2])]->{'a': 'b->c'}") == ([("A", {"x": "1", "y": [1, 2]})],
                                                                    "{'a': 'b->c'}", False)
    assert parse_request("[A(s='x->y'), B()]") == ([("A", {"s": "x->y"}), ("B", {})], None, False)
    assert parse_request("[A(v='['p', 'q']')]->success") == ([("A", {"v": "['p', 'q']"})], "success", True)
    for bad in ("[A('positional')]", "A(x='1')", "[]", "[A(x=y)]", "[A(x='1'"):
        with pytest.raises(RequestError):
            parse_request(bad)


def _copy_apibank(tmp_path: Path) -> Path:
    root = tmp_path / "apibank"
    shutil.copytree(APIBANK, root, ignore=shutil.ignore_patterns("training-data", "toolsearcher-free"))
    return root


def test_apibank_skips_are_counted(tmp_path):
    root = _copy_apibank(tmp_path)
    l1 = root / "json_test_data" / "level-1-api.json"
    items = json.loads(l1.read_text())
    files = sorted({it["file"] for it in items})
    for it in items:  # one dialogue calls an unknown API, another has a request that does not parse
        if it["file"] == files[0]:
            it["expected_output"] = it["expected_output"].replace("API-Request: [", "API-Request: [NoSuchApi")
            it["input"] = it["input"].replace("API-Request: [", "API-Request: [NoSuchApi")
        if it["file"] == files[1]:
            it["expected_output"] = it["expected_output"].replace("API-Request: [", "API-Request: [[")
            it["input"] = it["input"].replace("API-Request: [", "API-Request: [[")
    multi = next(f for f in files[2:] if sum(it["file"] == f for it in items) > 1)
    shortest = min((it for it in items if it["file"] == multi), key=lambda it: len(it["input"]))
    shortest["expected_output"] = "API-Request: [Other()]"  # an item that disagrees with its dialogue
    l1.write_text(json.dumps(items))
    l3 = root / "json_test_data" / "level-3.json"
    lv3 = json.loads(l3.read_text())
    lv3[0]["apis"][1]["api_name"] = "NoSuchApi"
    l3.write_text(json.dumps(lv3))
    ds = load_dataset("apibank", path=root, levels=(1, 3))
    assert dict(ds.skipped) == {SKIP_UNKNOWN_API: 1, SKIP_UNPARSABLE: 1, SKIP_LV3_UNKNOWN_API: 1,
                                SKIP_NOT_PREFIX: 1}
    assert len(ds.trajectories) == 210 + 49
    groups = {t.group for t in ds.trajectories}
    assert files[0] not in groups and files[1] not in groups and multi in groups and "lv3-0" not in groups


def test_apibank_bad_inputs(tmp_path):
    with pytest.raises(DataError, match="directory not found"):
        load_dataset("apibank", path=tmp_path / "missing")
    with pytest.raises(ValueError, match="levels"):
        load_dataset("apibank", levels=(4,))
    root = _copy_apibank(tmp_path)
    l2 = root / "json_test_data" / "level-2-api.json"
    items = json.loads(l2.read_text())
    del items[5]["file"]
    l2.write_text(json.dumps(items))
    with pytest.raises(DataError) as err:
        load_dataset("apibank", path=root, levels=2)
    assert str(l2) in str(err.value) and err.value.record == "#5" and err.value.field == "file"
    (root / "json_test_data" / "level-3.json").write_text("{}")
    with pytest.raises(DataError, match="level-3.json.*JSON array"):
        load_dataset("apibank", path=root, levels=3)
