"""The executor interface: the model that chooses a tool from what a scorer presents.

Everything a scorer or the evaluation needs from a model goes through an :class:`Executor`:
``choose`` for a tool decision, ``complete`` for free text (H-EPM's state summaries, Insight's
distilled lessons). No scorer talks to a model by itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tracer.core.types import ToolCall


@dataclass(frozen=True)
class Decision:
    """What the executor did at one step.

    Args:
        call: the tool call it made, or None if it answered without one.
        text: message content (and reasoning, if the model gives any) carried forward in free-running.
        prompt_tokens, completion_tokens: as reported by the model server (None for the oracle).
        malformed: the model emitted a tool call that could not be parsed (counted separately).
        error: transport or server error text after retries (the step counts as no call).
        seconds: wall seconds of the request, from sending it to its reply's last byte (retries
            included; not the time waiting for a free slot under ``concurrency``); None for the oracle.
    """

    call: ToolCall | None
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    malformed: bool = False
    error: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)
    seconds: float | None = None


@dataclass(frozen=True)
class Request:
    """One tool decision to make: the conversation, the presented tools (best first) and, for the
    oracle only, the gold call."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]]
    gold: ToolCall | None = None


@runtime_checkable
class Executor(Protocol):
    name: str
    is_oracle: bool
    tokenizer_name: str | None  # whose tokens prompt costs are counted in (None: the local fallback)

    def choose(self, requests: Sequence[Request]) -> list[Decision]:
        """One decision per request (implementations may run them concurrently)."""
        ...

    def complete(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Free-text completion (summaries, distillation)."""
        ...
