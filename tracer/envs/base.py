"""The interface free-running evaluation drives: an environment makes one :class:`Episode` per task.

The runner (:meth:`tracer.eval.runner.Evaluator.free_running`) advances every held-out task in
lockstep: it asks each ready episode for its conversation so far, scores the step, lets the
executor decide, and hands the decision back to the episode, which executes the call on its own
backends, applies the benchmark's turn rules and finally gives the benchmark's verdict.
"""

from __future__ import annotations

from typing import Any, Protocol

from tracer.core.types import ToolCall, Trajectory
from tracer.executors import Decision


class Episode(Protocol):
    """One task being played: its live conversation and backends."""

    traj: Trajectory
    messages: list[dict]               # the conversation so far (OpenAI chat messages)
    n_step: int                        # steps taken so far
    outstanding: list[ToolCall]        # the current turn's gold calls not yet made (the oracle follows them)

    def ready(self, oracle: bool) -> bool:
        """True while the task needs another step (closing the turns an oracle has finished)."""

    def withheld(self) -> frozenset[str]:
        """Tool names the benchmark has not given the model yet (never presented)."""

    def apply(self, dec: Decision, gold: ToolCall | None, max_steps: int) -> None:
        """Carry the executor's decision forward: execute its call, or end the turn."""

    def verdict(self, fold: int) -> dict[str, Any]:
        """The finished task's record (``tasks.jsonl``); ``success`` is the benchmark's own verdict."""


class Environment(Protocol):
    """Makes a fresh episode (own backends, own state) for a task of its benchmark."""

    def episode(self, traj: Trajectory) -> Episode: ...
