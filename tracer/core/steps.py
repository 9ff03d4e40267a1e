"""Decision steps out of OpenAI chat messages.

Every user message opens a turn; every tool call of an assistant message is one step, parallel
calls in their listed order; the turn-local prefix resets at each user message.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from typing import Any

from tracer.core.types import Message, Step, ToolCall, Trajectory


def call_name_args(call: Mapping[str, Any]) -> tuple[str, dict]:
    """(name, arguments) of an OpenAI tool call; arguments that are not a JSON object read as ``{}``."""
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args = {}
    return fn["name"], dict(args) if isinstance(args, Mapping) else {}


def iter_calls(messages: Sequence[Message]) -> Iterator[tuple[int, int, str, dict]]:
    """Yield (message index, call index within the message, name, arguments) for every tool call."""
    for mi, m in enumerate(messages):
        if m.get("role") == "assistant":
            for ci, call in enumerate(m.get("tool_calls") or ()):
                name, args = call_name_args(call)
                yield mi, ci, name, args


def extract_steps(traj: Trajectory) -> list[Step]:
    """All decision steps of one trajectory, in order."""
    steps: list[Step] = []
    turn, prefix, history = -1, [], []
    messages = traj.messages
    for mi, m in enumerate(messages):
        role = m.get("role")
        if role == "user":
            turn += 1
            prefix = []
            continue
        if role != "assistant" or not m.get("tool_calls"):
            continue
        calls = list(m["tool_calls"])
        for ci, call in enumerate(calls):
            name, args = call_name_args(call)
            context = tuple(messages[:mi])
            if ci > 0:  # earlier parallel calls of the same message are already made
                context = context + ({**{k: v for k, v in m.items() if k != "tool_calls"},
                                      "content": m.get("content"), "tool_calls": calls[:ci]},)
            steps.append(Step(
                trajectory_id=traj.id, group=traj.group, turn=max(turn, 0), position=len(prefix),
                prefix=tuple(prefix), history=tuple(history), gold=name, context=context,
                index=len(steps), gold_arguments=args,
            ))
            prefix.append(name)
            history.append(name)
    return steps


def extract_all(trajectories: Iterable[Trajectory]) -> list[Step]:
    return [s for t in trajectories for s in extract_steps(t)]


def gold_turns(traj: Trajectory) -> list[tuple[list[Message], list[ToolCall]]]:
    """Split a gold conversation into turns: (user messages, gold calls) in order.

    Each user message opens a turn, as in :func:`extract_steps` and
    :func:`tracer.data.bfcl_backends.gold_states`, so free-running compares turn ``i`` with gold state
    ``i``. A turn may have no calls (BFCL's clarification turns). Calls before the first user message
    form turn 0.
    """
    turns: list[tuple[list, list]] = []
    for m in traj.messages:
        role = m.get("role")
        if role == "user":
            turns.append(([m], []))
        elif role == "assistant" and m.get("tool_calls"):
            if not turns:
                turns.append(([], []))
            for call in m["tool_calls"]:
                turns[-1][1].append(ToolCall(*call_name_args(call), call.get("id", "")))
    return turns


def turns_of(traj: Trajectory) -> list[list[str]]:
    """The tool names called in each user turn (turns without calls included as empty lists)."""
    return [[c.name for c in calls] for _, calls in gold_turns(traj)]


def step_from_messages(messages: Sequence[Message], trajectory_id: str = "live", group: str = "live",
                       gold: str = "", index: int | None = None, known: Container[str] | None = None) -> Step:
    """The decision step at the end of a live conversation (``gold`` empty when the next call is unknown).

    Same fields as :func:`extract_steps` gives the step whose context is ``messages``: every user
    message opens a turn; ``prefix`` holds the calls made since the last user message, ``history``
    every call so far. ``known``: when given, calls of other names stay in ``context`` only (a live
    conversation may call tools the index never saw: :mod:`tracer.core.live`).
    """
    turn, prefix, history = -1, [], []
    for m in messages:
        role = m.get("role")
        if role == "user":
            turn, prefix = turn + 1, []
        elif role == "assistant":
            for call in m.get("tool_calls") or ():
                name = call.get("function", call)["name"]
                if known is None or name in known:
                    prefix.append(name)
                    history.append(name)
    return Step(trajectory_id=trajectory_id, group=group, turn=max(turn, 0), position=len(prefix),
                prefix=tuple(prefix), history=tuple(history), gold=gold, context=tuple(messages),
                index=len(history) if index is None else index)
