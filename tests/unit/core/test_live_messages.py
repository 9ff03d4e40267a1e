"""Reading a live conversation leniently (tracer.core.live): each leniency gives the step written out by
hand and is counted; what cannot be read is still refused naming the field; a tidy conversation is passed
through as it is."""

from __future__ import annotations

import pytest
from builders import call, result

from tracer.core.live import read_live
from tracer.core.types import Step
from tracer.core.validate import InvalidField

KNOWN = {"search_flights", "book_flight", "get_weather"}
USER = {"role": "user", "content": "Find a flight and book it"}


def step(context, prefix=(), history=None, turn=0) -> Step:
    history = prefix if history is None else history
    return Step(trajectory_id="live", group="live", turn=turn, position=len(prefix), prefix=tuple(prefix),
                history=tuple(history), gold="", context=tuple(context), index=len(history))


def with_args(args, name="search_flights", i=0) -> dict:
    m = call(name, i)
    m["tool_calls"][0]["function"]["arguments"] = args
    return m


def test_a_tidy_conversation_is_read_as_it_is_and_nothing_is_counted():
    msgs = [{"role": "system", "content": "Be brief"}, USER, call("search_flights", 0), result(0)]
    live = read_live(msgs, KNOWN)
    assert live.step == step(msgs, ["search_flights"]) and live.lenient == {}
    assert all(a is b for a, b in zip(live.step.context, msgs))  # no copy


def test_a_developer_message_is_a_system_message():
    live = read_live([{"role": "developer", "content": "Be brief"}, USER], KNOWN)
    assert live.step == step([{"role": "system", "content": "Be brief"}, USER])
    assert live.lenient == {"developer_role": 1}


def test_calls_of_unknown_tools_are_context_not_prefix_steps():
    msgs = [USER, call("search_flights", 0), result(0), call("get_stock_price", 1), result(1),
            call("book_flight", 2), result(2)]
    live = read_live(msgs, KNOWN)
    assert live.step == step(msgs, ["search_flights", "book_flight"])
    assert live.lenient == {"unknown_tool_call": 1}


def test_a_tool_message_whose_call_was_trimmed_is_context():
    msgs = [USER, result(7, "sunny"), call("get_weather", 0)]
    live = read_live(msgs, KNOWN)
    assert live.step == step(msgs, ["get_weather"]) and live.lenient == {"orphan_tool_message": 1}


@pytest.mark.parametrize(("args", "read"), [
    ('{"to": "JF', "{}"), ("[1, 2]", "{}"), ("5", "{}"), (7, "{}"), ({"to": "JFK"}, '{"to": "JFK"}'),
])
def test_arguments_that_are_no_json_object_read_as_empty_or_serialised(args, read):
    live = read_live([USER, with_args(args), result(0)], KNOWN)
    assert live.step == step([USER, with_args(read), result(0)], ["search_flights"])
    assert live.lenient == {"bad_arguments": 1}


@pytest.mark.parametrize(("content", "read", "kind"), [
    (5, "5", {"content_type": 1}),
    ({"a": 1}, '{"a": 1}', {"content_type": 1}),
    (["hi", {"type": "text", "text": 3}, {"type": "text", "text": None}, {"type": "image_url"}],
     [{"type": "text", "text": "hi"}, {"type": "text", "text": "3"}, {"type": "text", "text": ""},
      {"type": "image_url"}], {"content_type": 3}),
    ("caf\ud800 au lait", "caf? au lait", {"bad_unicode": 1}),
])
def test_odd_content_is_read_as_text(content, read, kind):
    live = read_live([{"role": "user", "content": content}], KNOWN)
    assert live.step == step([{"role": "user", "content": read}]) and live.lenient == kind


def test_other_roles_and_misplaced_calls_are_kept_as_context():
    odd = {"role": "function", "name": "x", "content": "42"}
    user_calls = {"role": "user", "content": "go", "tool_calls": call("book_flight")["tool_calls"]}
    live = read_live([odd, user_calls], KNOWN)
    assert live.step == step([odd, {"role": "user", "content": "go", "tool_calls": None}])
    assert live.lenient == {"unknown_role": 1, "misplaced_tool_calls": 1}


@pytest.mark.parametrize(("messages", "field"), [
    ("find a flight", "messages"), (None, "messages"), ([USER, "hello"], "messages[1]"),
    ([{"content": "hi"}], "messages[0].role"),
    ([USER, {"role": "assistant", "tool_calls": "search_flights"}], "messages[1].tool_calls"),
    ([USER, {"role": "assistant", "tool_calls": [{"function": {}}]}],
     "messages[1].tool_calls[0].function.name"),
])
def test_what_cannot_be_read_is_refused_naming_the_field(messages, field):
    with pytest.raises(InvalidField) as e:
        read_live(messages, KNOWN)
    assert e.value.field == field
