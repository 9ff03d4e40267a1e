"""A logged conversation brought to the dataset rules (tracer.serve.log.record.normalise): every problem the
message model finds is repaired or left out as the module docstring says, counted by rule, and what is
written passes the strict reader."""

from __future__ import annotations

from tracer.core.messages import check_messages
from tracer.serve.log.record import normalise

OMITTED = {"type": "image_url", "image_url": {"detail": "low"},
           "omitted": {"media_type": "image/png", "bytes": 3}}


def test_a_hostile_conversation_is_written_under_the_dataset_rules():
    messages = [
        {"role": "developer", "content": "Be brief"},
        {"role": "function", "content": "legacy"},                                     # left out
        {"role": "user", "content": ["hi", {"type": "image_url", "text": 3}, {"type": "text"}, OMITTED]},
        {"role": "user", "content": {"a": 1}, "tool_calls": [{"function": {"name": "x"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "function": {"arguments": "{}"}},                               # no name: left out
            {"id": "b", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "c", "function": {"name": "book\ud800", "arguments": '{"to": "JF'}}]},
        {"role": "tool", "tool_call_id": "a", "content": "its call was left out"},      # left out
        {"role": "tool", "tool_call_id": "c", "content": "booked"},
    ]
    out, fixes, raw = normalise(messages)
    assert out == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": [{"type": "text", "text": '"hi"'}, {"type": "image_url", "text": "3"},
                                     {"type": "text", "text": "null"}, OMITTED]},
        {"role": "user", "content": '{"a": 1}'},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "b", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c", "function": {"name": "book?", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "booked"},
    ]
    assert fixes == {"developer_as_system": 1, "message_dropped": 1, "content_part_as_text": 3,
                     "media_omitted": 1, "content_as_text": 1, "tool_calls_dropped": 1, "call_dropped": 1,
                     "arguments_object_as_text": 1, "arguments_replaced": 1, "orphan_tool_message_dropped": 1}
    # by the call's position in what is written: the second call read, the first one written after the drop
    assert raw == {"messages[3].tool_calls[1]": '{"to": "JF'}
    check_messages(out)


def test_a_tidy_conversation_is_written_as_it_came():
    weather = {"id": "w", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [weather]},
                {"role": "tool", "tool_call_id": "w", "content": "sunny"}]
    assert normalise(messages) == (messages, {}, {})
