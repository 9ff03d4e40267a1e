"""When the conversation log marks a record as a trial conversation's (``metadata.explored``,
tracer.serve.log.sink): only when every step the record holds was presented as a trial's."""

from __future__ import annotations

import json

import pytest

from tracer.scorer_base.trial import EXPLORED
from tracer.serve.log.sink import ConversationLog

ASK = {"role": "user", "content": "Find a flight and book it"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "a", "type": "function", "function": {"name": "search_flights", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "a", "content": "UA 1"}
BOOK = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "b", "type": "function", "function": {"name": "book_flight", "arguments": "{}"}}]}


def written(tmp_path, *steps: tuple[list[dict], dict, bool]) -> dict:
    """The metadata of one conversation's record, observed at ``steps`` (request messages, reply, trial),
    then finished."""
    sink = ConversationLog(tmp_path / "log")
    for messages, reply, trial in steps:
        sink.observe("c", messages, [], ["search_flights", "book_flight"], reply, trial)
    assert sink.finish("c", True)
    sink.close()   # waits for the writer
    [line] = (tmp_path / "log" / "trajectories.jsonl").read_text().splitlines()
    return json.loads(line)["metadata"]


@pytest.mark.parametrize(("first", "second", "marked"), [
    (True, True, True),      # a trial from its first step
    (False, True, False),    # became a trial midway (a reload): its first step showed one ranking
    (True, False, False),    # stopped being one
    (False, False, False),
])
def test_a_record_is_marked_only_when_every_step_was_a_trial(tmp_path, first, second, marked):
    meta = written(tmp_path, ([ASK], CALL, first), ([ASK, CALL, RESULT], BOOK, second))
    assert meta.get(EXPLORED) is (True if marked else None)


def test_a_conversation_first_seen_midway_is_not_marked(tmp_path):
    """Its history holds a call the log never saw presented (an eviction, a restart, another replica)."""
    assert EXPLORED not in written(tmp_path, ([ASK, CALL, RESULT], BOOK, True))
