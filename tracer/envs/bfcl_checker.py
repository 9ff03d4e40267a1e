"""BFCL's own verdict on a finished multi-turn task: ``bfcl_eval``'s ``multi_turn_checker``, unchanged.

BFCL's rules, per turn (``bfcl_eval/eval_checker/multi_turn_eval/multi_turn_checker.py``):

- a turn whose ground truth is not empty fails when the model made no call in it
  (``multi_turn:empty_turn_model_response``);
- turns with empty ground truth are not checked (their calls still run, so later turns see them);
- after each checked turn every backend's public state must equal the gold state
  (``multi_turn:instance_state_mismatch``), and every result of that turn's gold calls must be
  among the model's execution results so far, in any order (``multi_turn:execution_response_mismatch``);
- a task force-stopped by the step cap fails before any check (``multi_turn:force_terminated``,
  as ``eval_runner`` does when the model's turns are fewer than the ground truth's).

:func:`bfcl_verdict` hands the executed calls to that checker as BFCL's decoded model output:
one step per call (our loop makes one call per step), each call the string BFCL's
``convert_to_function_call`` writes, ``name(key=repr(value), ...)``. The checker ``eval``s those
strings, so a call whose name is not a tool of the task, or whose argument names are not Python
identifiers, is passed as :data:`UNKNOWN_CALL` instead: it fails to run, as the original would
have, and nothing else runs.

The checker keeps backend instances in its module's globals under the model name; each verdict
uses a fresh name and removes its instances afterwards, so verdicts never share state.
"""

from __future__ import annotations

import keyword
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from tracer.core.types import ToolCall
from tracer.data.bfcl_backends import backend_config

FORCE_TERMINATED = "multi_turn:force_terminated"
# a call that only fails (NameError), standing in for a call the checker must not eval
UNKNOWN_CALL = "_tracer_unknown_tool()"


def call_string(call: ToolCall, tools: set[str] | frozenset[str]) -> str:
    """``call`` as BFCL's decoded output (``convert_to_function_call``), or :data:`UNKNOWN_CALL`."""
    args = call.arguments if isinstance(call.arguments, Mapping) else None
    if (call.name not in tools or args is None
            or any(not isinstance(k, str) or not k.isidentifier() or keyword.iskeyword(k) for k in args)):
        return UNKNOWN_CALL
    return f"{call.name}({','.join(f'{k}={v!r}' for k, v in args.items())})"


def bfcl_verdict(metadata: Mapping[str, Any], turn_calls: Sequence[Sequence[ToolCall]], tools: set[str],
                 force_terminated: bool = False) -> dict[str, Any]:
    """BFCL's verdict on one task: ``{"valid": bool, "error_type": str | None, "error_message": str | None}``.

    Args:
        metadata: the BFCL trajectory's metadata (``bfcl_id``, ``initial_config``,
            ``involved_classes``, ``ground_truth``: per turn, the gold call strings).
        turn_calls: per turn the calls executed, in order (turns never reached may be left out
            only when ``force_terminated``).
        tools: the names of the task's tools (calls naming anything else become :data:`UNKNOWN_CALL`).
        force_terminated: the step cap stopped the task.
    """
    truth = metadata["ground_truth"]
    if force_terminated:
        return {"valid": False, "error_type": FORCE_TERMINATED,
                "error_message": f"force-terminated after {len(turn_calls)} of {len(truth)} turns"}
    if len(turn_calls) != len(truth):
        raise ValueError(f"{metadata['bfcl_id']}: {len(turn_calls)} turns of calls "
                         f"for {len(truth)} ground-truth turns")
    decoded = [[[call_string(c, tools)] for c in calls] for calls in turn_calls]  # turn -> step -> calls
    entry = {"id": metadata["bfcl_id"], "initial_config": metadata["initial_config"],
             "involved_classes": metadata["involved_classes"]}
    # a clear error when bfcl_eval is missing (an optional dependency, imported on first use)
    backend_config()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    model_name = f"tracer_{uuid.uuid4().hex}"
    try:
        result = multi_turn_checker(decoded, truth, entry, metadata["bfcl_id"].rsplit("_", 1)[0], model_name)
    finally:
        prefix = re.sub(r"[-./:]", "_", model_name)
        for name in [n for n in vars(multi_turn_utils) if n.startswith(prefix)]:
            delattr(multi_turn_utils, name)
    return {"valid": bool(result["valid"]), "error_type": result.get("error_type"),
            "error_message": result.get("error_message")}
