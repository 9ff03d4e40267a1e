"""BFCL as a free-running environment: each task an episode with its live conversation, its own backends,
BFCL's turn rules and BFCL's verdict.

The loop makes one call per step (the executor's first tool call). A turn opens with its user
message and ends when the executor answers without a call (a text answer, a malformed call or an
executor error: BFCL moves to the next turn when a reply has no decodable call) or, for the
oracle, when the turn's gold calls are all made.

Step cap. BFCL force-stops a task when a turn reaches its 21st model response with calls
(``MAXIMUM_STEP_LIMIT = 20`` in ``bfcl_eval/model_handler/base_handler.py``) and fails it
(``multi_turn:force_terminated``). A BFCL response may carry parallel calls; here a step is one
call, so the cap counts calls: ``max_steps`` calls per turn, or the turn's gold call count when that
is larger (two long_context turns need 34 calls), and a call beyond the cap force-stops the task.

Withheld functions (``miss_func``): a function BFCL adds at turn ``t`` is not presented before
``t`` (:meth:`Episode.withheld`).

Verdicts. ``success`` is BFCL's own ``multi_turn_checker`` on the executed calls
(:func:`tracer.envs.bfcl_checker.bfcl_verdict`); ``state_success`` is our cross-check: after every
turn the backends' state equals the gold state and the turn ended within the cap.
"""

from __future__ import annotations

from typing import Any

from tracer.core.steps import gold_turns
from tracer.core.types import ToolCall, Trajectory
from tracer.data.bfcl_backends import BFCLBackends, gold_states, withheld_tools
from tracer.envs.bfcl_checker import bfcl_verdict
from tracer.executors import Decision


class BFCLEnvironment:
    """BFCL's multi-turn backends (:class:`tracer.data.bfcl_backends.BFCLBackends`) behind the
    :class:`~tracer.envs.base.Environment` interface."""

    def episode(self, traj: Trajectory) -> BFCLEpisode:
        return BFCLEpisode(traj)


class BFCLEpisode:
    """One BFCL task in free-running (see the module docstring for the rules)."""

    def __init__(self, traj: Trajectory):
        self.traj = traj
        self.env = BFCLBackends.from_metadata(traj.metadata)
        self.tools = frozenset(self.env.tools)
        self.want = gold_states(traj)
        self.turns = gold_turns(traj)
        self.messages: list[dict] = [dict(m) for m in traj.messages if m.get("role") == "system"]
        self.turn, self.n_step = -1, 0
        self.turn_ok: list[bool] = []          # our state cross-check, per turn
        self.turn_calls: list[list[ToolCall]] = []  # the calls executed in each turn (BFCL's checker input)
        self.outstanding: list[ToolCall] = []
        self.calls_in_turn = self.gold_in_turn = 0
        self.done = self.force_terminated = False
        self._next_turn()

    def _next_turn(self) -> None:
        self.turn += 1
        if self.turn >= len(self.turns):
            self.done = True
            return
        user_msgs, gold_calls = self.turns[self.turn]
        self.messages.extend(dict(m) for m in user_msgs)
        self.turn_calls.append([])
        self.outstanding, self.calls_in_turn, self.gold_in_turn = list(gold_calls), 0, len(gold_calls)

    def _end_turn(self) -> None:
        state_ok = self.env.same_state(self.want[self.turn]) if self.turn < len(self.want) else True
        self.turn_ok.append(bool(state_ok))
        self._next_turn()

    def withheld(self) -> frozenset[str]:
        """Tools BFCL has not given the model yet at the current turn."""
        return withheld_tools(self.traj.metadata, self.turn)

    def ready(self, oracle: bool) -> bool:
        """Close the turns the oracle has finished; True while this task needs another step."""
        while not self.done and oracle and not self.outstanding:
            self._end_turn()
        return not self.done

    def apply(self, dec: Decision, gold: ToolCall | None, max_steps: int) -> None:
        """Carry the executor's decision forward: execute its call on the backends, or end the turn."""
        self.n_step += 1
        if dec.call is None:
            # the text answer is not carried forward: gold conversations hold none, and the next
            # context should look like the ones the scorer was trained on
            self._end_turn()
            return
        if self.calls_in_turn >= max(max_steps, self.gold_in_turn):
            self.turn_ok.append(False)
            self.done = self.force_terminated = True
            return
        call = ToolCall(dec.call.name, dict(dec.call.arguments),
                        dec.call.id or f"fr-{self.traj.id}-{self.n_step}")
        result = self.env.execute(call.name, dict(call.arguments))
        self.calls_in_turn += 1
        self.turn_calls[-1].append(call)
        self.messages.append({"role": "assistant", "content": dec.text or None,
                              "tool_calls": [call.to_openai()]})
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if gold is not None and call.name == gold.name:
            self.outstanding.pop(0)

    def verdict(self, fold: int) -> dict[str, Any]:
        """The finished task's line in ``tasks.jsonl``: BFCL's verdict (``success``) and our cross-check."""
        bfcl = bfcl_verdict(self.traj.metadata, self.turn_calls, set(self.tools), self.force_terminated)
        return {"fold": fold, "trajectory_id": self.traj.id, "group": self.traj.group,
                "category": self.traj.metadata.get("category"), "success": bfcl["valid"],
                "bfcl_error_type": bfcl["error_type"], "state_success": all(self.turn_ok),
                "turns_ok": self.turn_ok, "force_terminated": self.force_terminated, "steps": self.n_step}
