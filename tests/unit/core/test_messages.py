"""The message model (tracer.core.messages): what it refuses, located and named by kind, once per problem;
the dataset rules it states; and the copy-on-write rewrite the lenient readers repair with."""

from __future__ import annotations

import pytest
from builders import call, result

from tracer.core.message_paths import replace_at
from tracer.core.messages import check_messages, find_problems
from tracer.core.validate import InvalidField

USER = {"role": "user", "content": "Find a flight"}


def with_args(args, name="search_flights") -> dict:
    m = call(name)
    m["tool_calls"][0]["function"]["arguments"] = args
    return m


def kinds(message) -> list[tuple[tuple, str]]:
    return [(p.at, p.kind) for p in find_problems([USER, message]).get(1, [])]


def test_a_tidy_conversation_has_no_problems():
    parts = {"role": "user",
             "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "u"}}]}
    calls_as_tuple = {"role": "assistant", "tool_calls": tuple(call("book_flight", 1)["tool_calls"])}
    no_calls = [{"role": "user", "content": None, "tool_calls": c} for c in ([], None, "")]
    messages = [{"role": "system", "content": "Be brief"}, USER, parts, with_args(""), with_args(None),
                result(0), calls_as_tuple, result(1), *no_calls]
    assert find_problems(messages) == {}


@pytest.mark.parametrize(("message", "expected"), [
    ("hello", [((), "not_a_message")]),
    ({"content": "hi"}, [(("role",), "role_type")]),
    ({"role": 3}, [(("role",), "role_type")]),
    ({"role": "developer", "content": "x"}, [(("role",), "developer_role")]),
    ({"role": "function", "content": "x"}, [(("role",), "unknown_role")]),
    # one problem although both members of the union (a string, a list of parts) refuse it
    ({"role": "user", "content": 5}, [(("content",), "content_type")]),
    ({"role": "user", "content": ("a",)}, [(("content",), "content_type")]),
    ({"role": "user", "content": "caf\ud800"}, [(("content",), "bad_unicode")]),
    ({"role": "user", "content": ["hi", {"text": 3}, {"type": "text"}, {"type": "image_url", "text": None}]},
     [(("content", 0), "part_not_object"), (("content", 1), "part_without_type"),
      (("content", 1, "text"), "text_type"), (("content", 2, "text"), "text_missing"),
      (("content", 3, "text"), "text_type")]),
    # misplaced calls are one problem, whatever they hold
    ({"role": "user", "tool_calls": [{"function": {}}]}, [(("tool_calls",), "misplaced_tool_calls")]),
    ({"role": "assistant", "tool_calls": "search_flights"}, [(("tool_calls",), "tool_calls_type")]),
    ({"role": "assistant", "tool_calls": ["x", {}, {"function": {"name": ""}}]},
     [(("tool_calls", i, "function", "name"), "no_function_name") for i in range(3)]),
    (with_args("", name="caf\ud800"), [(("tool_calls", 0, "function", "name"), "bad_unicode")]),
    (with_args({"a": 1}), [(("tool_calls", 0, "function", "arguments"), "arguments_type")]),
    (with_args("{oops"), [(("tool_calls", 0, "function", "arguments"), "arguments_json")]),
    (with_args("[1]"), [(("tool_calls", 0, "function", "arguments"), "arguments_object")]),
    # JSON is checked before Unicode: a truncated string reads as no arguments, whatever it holds
    (with_args('{"to": "\ud800'), [(("tool_calls", 0, "function", "arguments"), "arguments_json")]),
    (with_args('{"to": "\ud800"}'), [(("tool_calls", 0, "function", "arguments"), "bad_unicode")]),
])
def test_each_problem_is_found_once_at_its_place(message, expected):
    assert kinds(message) == expected


@pytest.mark.parametrize(("messages", "field", "problem"), [
    ([{"role": "user", "content": [{"type": "image_url", "text": 3}]}], "messages[0].content[0].text",
     "must be a string, got int"),
    ([{"role": "user", "content": "ok \ud83c"}], "messages[0].content",
     "lone surrogate '\\ud83c' at character 3: not valid Unicode"),
    ([USER, with_args("5")], "messages[1].tool_calls[0].function.arguments",
     "must encode a JSON object, got a int"),
    ([USER, {"role": "assistant", "tool_calls": {"id": "c0"}}], "messages[1].tool_calls",
     "must be a list, got dict"),
    ([USER, call("teleport", 0)], "messages[1].tool_calls[0].function.name",
     "names 'teleport', which is not in the registry"),
    ([USER, call("search_flights", 0), result(1)], "messages[2].tool_call_id",
     "'c1' answers no earlier tool call (known ids: ['c0'])"),
])
def test_the_dataset_rules_name_the_field(messages, field, problem):
    with pytest.raises(InvalidField) as e:
        check_messages(messages, {"search_flights"})
    assert (e.value.field, e.value.problem) == (field, problem)


def test_replace_at_copies_only_the_way_to_the_place():
    text_part, image_part = {"type": "text", "text": 3}, {"type": "image_url", "image_url": {"url": "u"}}
    message = {"role": "user", "content": [text_part, image_part], "name": "n"}
    out = replace_at(message, ("content", 0, "text"), "3")
    assert out == {"role": "user", "content": [{"type": "text", "text": "3"}, image_part], "name": "n"}
    assert list(out) == ["role", "content", "name"] and out["content"][1] is image_part
    assert message["content"][0] is text_part and text_part["text"] == 3  # the input is left as it was
