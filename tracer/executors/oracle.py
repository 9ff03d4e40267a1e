"""The oracle executor: picks the gold tool when it is presented, otherwise the top presented tool.

It isolates the retriever: with it, selection accuracy equals coverage of the presented set and
free-running task success depends on retrieval alone. Every report labels its numbers as oracle.
In free-running it calls the gold call with its gold arguments when that tool is presented;
otherwise it calls its top presented tool with the gold arguments that tool's schema accepts
(the backend's error then becomes the tool result).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tracer.core.types import ToolCall
from tracer.executors.base import Decision, Request


class OracleExecutor:
    name = "oracle"
    is_oracle = True
    tokenizer_name = None

    def choose(self, requests: Sequence[Request]) -> list[Decision]:
        return [self._one(r) for r in requests]

    def _one(self, r: Request) -> Decision:
        names = [t["function"]["name"] for t in r.tools]
        if r.gold is not None and r.gold.name in names:
            return Decision(call=r.gold)
        if not names:
            return Decision(call=None)
        top = r.tools[0]["function"]
        props = (top.get("parameters") or {}).get("properties") or {}
        args = {k: v for k, v in (r.gold.arguments if r.gold else {}).items() if k in props}
        return Decision(call=ToolCall(name=names[0], arguments=args, id=r.gold.id if r.gold else "oracle"))

    def complete(self, messages: Sequence[Mapping[str, Any]]) -> str:
        raise NotImplementedError("the oracle executor produces no free text; "
                                  "scorers use their offline digest")
