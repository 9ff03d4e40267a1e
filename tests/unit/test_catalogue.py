"""The public tool catalogue of the registry-scale benchmark: parsers on small git mirrors, names, growth."""

from __future__ import annotations

import json
import re

import pytest
from builders import git_repo

from benchmarks.catalogue import prepare, with_distractors
from benchmarks.catalogue_sources import botocore, clean, googleapis, tool_name
from tracer.core.errors import DataError
from tracer.core.types import Registry, Tool
from tracer.data.corpora import Clone


def mirror(root, slug: str, files: dict[str, str]) -> Clone:
    git_repo(root / slug.replace("/", "+") / "repo", files)
    return Clone(root, slug)


def test_names_are_openai_valid_and_long_ones_stay_distinct():
    a, b = tool_name("svc", "x" * 80), tool_name("svc", "x" * 79 + "y")
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", a) and len(a) == 64 and a != b
    assert tool_name("google.cloud", "v1/Get Thing") == "google_cloud_v1_Get_Thing"
    assert clean("<p>Lists <b>buckets</b>; see [the docs](https://x).</p>") == "Lists buckets ; see the docs."


def test_botocore_reads_the_newest_api_version_of_each_service(tmp_path):
    old = {"operations": {"OldOp": {"documentation": "old"}}, "shapes": {}}
    new = {"operations": {"ListThings": {"documentation": "<p>Lists things.</p>", "input": {"shape": "In"}}},
           "shapes": {"In": {"type": "structure", "required": ["Max"],
                             "members": {"Max": {"shape": "Int", "documentation": "At most."}}},
                      "Int": {"type": "integer"}}}
    repo = mirror(tmp_path, "boto/botocore",
                  {"botocore/data/thing/2019-01-01/service-2.json": json.dumps(old),
                   "botocore/data/thing/2021-06-01/service-2.json": json.dumps(new)})
    (t,) = list(botocore(repo))
    assert t["name"] == "aws_thing_ListThings" and t["description"] == "Lists things."
    assert t["parameters"]["properties"] == {"Max": {"type": "integer", "description": "At most."}}
    assert t["parameters"]["required"] == ["Max"]


def test_googleapis_takes_each_rpc_with_its_comment(tmp_path):
    proto = ("syntax = \"proto3\";\npackage google.cloud.widgets.v1;\nservice Widgets {\n"
             "  // Gets a widget.\n  // By name.\n  rpc GetWidget(GetWidgetRequest) returns (Widget) {}\n"
             "  rpc WatchWidgets(stream WatchRequest) returns (stream Widget) {}\n}\n")
    repo = mirror(tmp_path, "googleapis/googleapis", {"google/cloud/widgets/v1/widgets.proto": proto})
    tools = list(googleapis(repo))
    assert [t["name"] for t in tools] == ["cloud_widgets_v1_GetWidget", "cloud_widgets_v1_WatchWidgets"]
    assert tools[0]["description"] == "Gets a widget. By name." and tools[1]["description"] == ""


def test_prepare_checks_every_mirror_before_writing(tmp_path):
    out = tmp_path / "out" / "tools.jsonl"
    with pytest.raises(DataError, match="no clone of boto/botocore"):
        prepare(tmp_path, out)
    assert not out.parent.exists()
    with pytest.raises(ValueError, match="not a source"):
        prepare(tmp_path, out, skip=("nobody/nothing",))


def test_distractors_are_nested_seeded_and_skip_taken_names():
    reg = Registry([Tool("a"), Tool("b")])
    cat = [Tool(n, "d") for n in ("b", "c", "d", "e", "f")]
    big = with_distractors(reg, cat, 6)
    assert big.names[:2] == ("a", "b") and sorted(big.names[2:]) == ["c", "d", "e", "f"]
    assert with_distractors(reg, cat, 4).names == big.names[:4]
    with pytest.raises(ValueError, match="needs 5 distractors"):
        with_distractors(reg, cat, 7)
