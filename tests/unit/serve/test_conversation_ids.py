"""Conversation ids by continuation (tracer.serve.conversations): the cases the gateway test does not reach
(no answer remembered, identical twins, forks, the memory bound, the credential never kept)."""

from __future__ import annotations

import pickle

from builders import call, result

from tracer.serve.conversations import ConversationIds

OPEN = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Weather in Paris?"}]


def test_without_a_remembered_answer_the_request_itself_is_the_point_continued():
    ids = ConversationIds()
    first = ids.assign(OPEN, "Bearer k")
    later = ids.assign(OPEN + [call("get_weather", 0), result(0)], "Bearer k")  # a streamed answer: none kept
    assert (first.how, later.how, later.id) == ("new", "continued", first.id)


def test_the_answer_as_the_client_sends_it_back_is_the_longer_point():
    ids = ConversationIds()
    a, b = ids.assign(OPEN, "Bearer k"), ids.assign(OPEN, "Bearer k")
    reply_a, reply_b = call("get_weather", 0), call("get_weather", 1)   # their call ids differ
    ids.answered(a, {**reply_a, "refusal": None})                     # fields the client drops do not count
    ids.answered(b, reply_b)
    assert a.id != b.id and b.how == "new"                            # the same opening: two conversations
    assert ids.assign(OPEN + [reply_b, result(1)], "Bearer k").id == b.id
    assert ids.assign(OPEN + [reply_a, result(0)], "Bearer k").id == a.id


def test_identical_twins_get_one_id_each_and_a_fork_starts_a_new_one():
    ids = ConversationIds()
    twins = [ids.assign(OPEN, "Bearer k").id for _ in range(2)]
    step = OPEN + [call("get_weather", 0), result(0)]
    assert sorted(ids.assign(step, "Bearer k").id for _ in range(2)) == sorted(twins)
    fork = ids.assign(step, "Bearer k")                                 # a third request from the same point
    assert fork.how == "new" and fork.id not in twins


def test_the_header_wins_and_credentials_separate_and_are_never_kept():
    ids = ConversationIds()
    first = ids.assign(OPEN, "Bearer sk-secret-123")
    assert ids.assign(OPEN + [call("x")], "Bearer sk-other").id != first.id
    assert ids.assign(OPEN + [call("x")], None, header="mine").id == "mine"
    state = {k: v for k, v in vars(ids).items() if k != "_lock"}           # everything it holds
    assert b"sk-secret-123" not in pickle.dumps((state, first))


def test_memory_holds_at_most_max_conversations():
    ids = ConversationIds(max_conversations=3)
    for i in range(10):
        ids.assign([{"role": "user", "content": f"task {i}"}], "Bearer k")
    assert len(ids) == 3
    old = ids.assign([{"role": "user", "content": "task 0"}, call("x")], "Bearer k")
    assert old.how == "new"                                             # forgotten: a new id


def test_the_least_recently_assigned_is_forgotten_first_and_an_answer_does_not_renew_it():
    ids = ConversationIds(max_conversations=2)
    task = [[{"role": "user", "content": f"task {i}"}] for i in range(3)]
    first, second = ids.assign(task[0], "Bearer k"), ids.assign(task[1], "Bearer k")
    ids.answered(first, call("x", 0))             # remembered, but the conversation is still the oldest
    ids.assign(task[2], "Bearer k")               # full: the first goes, its answered point with it
    assert ids.assign(task[1] + [call("y", 1), result(1)], "Bearer k").id == second.id
    assert ids.assign(task[0] + [call("x", 0), result(0)], "Bearer k").how == "new"
    assert len(ids) == 2
