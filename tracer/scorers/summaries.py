"""State summaries for the memory baselines (H-EPM, Insight): from the executor model, or offline.

Both papers summarise the agent's state with a language model. When a (non-oracle) executor is
configured in :class:`~tracer.scorer_base.resources.Resources`, the summary is the model's answer to one
``complete`` call, counted by :class:`Summarizer`. Offline (no executor, or the oracle, which
produces no text) the summary is a deterministic *digest* of the state instead:

    request: <the latest user message>
    calls: <name> [ok]; <name> [error]; ... (the last ``max_calls`` calls, across turns)

A call's outcome is ``error`` when its tool result mentions an error, a failure, an exception or
an invalid input, ``ok`` otherwise, and ``pending`` when no result came back yet (an earlier
parallel call of the same message). Every report names which kind of summary was used
(:attr:`Summarizer.label`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracer.core.steps import iter_calls
from tracer.core.types import Message, Trajectory
from tracer.scorer_base.resources import Resources

_ERROR = re.compile(r"error|fail|exception|invalid|not found|denied", re.IGNORECASE)
SKIP = "SKIP"


def has_model(res: Resources) -> bool:
    """Whether the resources carry an executor that can write free text (not the oracle)."""
    return res.executor is not None and not res.executor.is_oracle


def _text(m: Message) -> str:
    content = m.get("content") or ""
    if not isinstance(content, str):  # content parts
        content = " ".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return " ".join(content.split())


def call_outcomes(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """(name, outcome) of every tool call in the messages, outcome ``ok``, ``error`` or ``pending``.

    Results are matched to calls by ``tool_call_id`` when both carry ids, otherwise in order.
    """
    calls: list[list[str]] = []          # [name, outcome, id]
    for m in messages:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or ():
                fn = call.get("function", call)
                calls.append([fn["name"], "pending", call.get("id") or ""])
        elif m.get("role") == "tool":
            outcome = "error" if _ERROR.search(_text(m)) else "ok"
            cid = m.get("tool_call_id") or ""
            match = next((c for c in calls if c[1] == "pending" and cid and c[2] == cid), None)
            match = match or next((c for c in calls if c[1] == "pending"), None)
            if match is not None:
                match[1] = outcome
    return [(c[0], c[1]) for c in calls]


def latest_request(messages: Sequence[Message]) -> str:
    return next((_text(m) for m in reversed(messages) if m.get("role") == "user"), "")


def digest(messages: Sequence[Message], max_calls: int = 12, request_chars: int = 400) -> str:
    """The offline summary of a state: the latest user request and the calls so far with outcomes."""
    calls = call_outcomes(messages)
    shown = calls[-max_calls:] if max_calls > 0 else []
    listed = "; ".join(f"{n} [{o}]" for n, o in shown) or "none"
    if len(calls) > len(shown):
        listed = f"({len(calls) - len(shown)} earlier) {listed}"
    return f"request: {latest_request(messages)[:request_chars]}\ncalls: {listed}"


@dataclass(frozen=True)
class Episode:
    """One user turn of a training trajectory, as Insight's memory stores it.

    ``text`` is the summary that is embedded and clustered; ``calls`` the tools called in the turn;
    ``success`` the trajectory's outcome (turns have no outcome of their own).
    """

    trajectory_id: str
    turn: int
    text: str
    calls: tuple[str, ...]
    success: bool


def turn_spans(traj: Trajectory) -> list[tuple[int, int]]:
    """(start, end) message indices of each user turn (messages before the first user message join turn 0)."""
    users = [i for i, m in enumerate(traj.messages) if m.get("role") == "user"]
    if not users:
        return [(0, len(traj.messages))] if traj.messages else []
    starts = [0] + users[1:]
    ends = users[1:] + [len(traj.messages)]
    return list(zip(starts, ends))


def episodes(traj: Trajectory) -> list[tuple[int, list[Message], tuple[str, ...]]]:
    """(turn, messages up to the end of the turn, calls of the turn) for every turn with a tool call."""
    out = []
    for turn, (lo, hi) in enumerate(turn_spans(traj)):
        calls = tuple(name for _, _, name, _ in iter_calls(traj.messages[lo:hi]))
        if calls:
            out.append((turn, list(traj.messages[:hi]), calls))
    return out


class Summarizer:
    """Summaries of states, from the executor model when there is one, else the offline digest.

    Args:
        source: ``auto`` (the model when ``res`` has a non-oracle executor, else offline), ``model``
            (require the model) or ``offline``.
        max_calls: calls listed by the offline digest.

    ``model_calls`` counts every ``complete`` call made (each is one extra model call per summary).
    Model summaries are cached by the state's digest, so an identical state costs one call.
    """

    def __init__(self, source: str = "auto", max_calls: int = 12):
        if source not in ("auto", "model", "offline"):
            raise ValueError(f"summarizer must be auto, model or offline, got {source!r}")
        self.source, self.max_calls = source, max_calls
        self.executor = None
        self.bound = False
        self.model_calls = 0
        self._cache: dict[tuple[str, str], str] = {}

    def bind(self, res: Resources) -> Summarizer:
        if self.source == "model" and not has_model(res):
            raise ValueError("summarizer: model needs a non-oracle executor in Resources (res.executor)")
        self.executor = res.executor if self.source != "offline" and has_model(res) else None
        self.bound = True
        return self

    @property
    def uses_model(self) -> bool:
        return self.executor is not None

    @property
    def label(self) -> str:
        if not self.bound and self.source != "offline":
            return (f"summarizer {self.source}: model summaries when an executor is configured, "
                    "else offline digest")
        return f"model summaries ({self.executor.name})" if self.uses_model \
            else "offline digest (no model)"

    def digest(self, messages: Sequence[Message]) -> str:
        return digest(messages, self.max_calls)

    def _ask(self, kind: str, prompt: str) -> str:
        key = (kind, prompt)
        if key not in self._cache:
            self.model_calls += 1
            self._cache[key] = (self.executor.complete([
                {"role": "system",
                 "content": "You summarise the state of a tool-using assistant for its memory."},
                {"role": "user", "content": prompt}]) or "").strip()
        return self._cache[key]

    def summarise(self, messages: Sequence[Message]) -> str:
        """The state summary: one model call (cached), or the offline digest."""
        d = self.digest(messages)
        if not self.uses_model:
            return d
        return self._ask("summary", "Summarise in two sentences the user's goal, what the assistant has done "
                         f"and what remains, given this state:\n{d}") or d

    def decide_and_summarise(self, messages: Sequence[Message]) -> str | None:
        """One model call that decides whether the state needs recalling and, if so, summarises it.

        Returns the summary, or None when the model answers ``SKIP`` (a routine step).
        """
        d = self.digest(messages)
        answer = self._ask("decide", "Is the next tool call a routine continuation of the previous one? "
                           f"If so, reply exactly {SKIP}. Otherwise summarise in two sentences "
                           f"the user's goal, what the assistant has done and what remains, "
                           f"given this state:\n{d}")
        return None if answer.strip().upper().startswith(SKIP) else (answer or d)

    def complete(self, prompt: str) -> str:
        """A free-text model call (Insight's distillation), counted."""
        return self._ask("complete", prompt)


def most_common(items: Sequence[Any], n: int) -> list[tuple[Any, int]]:
    """The n most frequent items, ties broken by first appearance (Counter keeps insertion order)."""
    return Counter(items).most_common(n)
