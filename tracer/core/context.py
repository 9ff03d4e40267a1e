"""How a conversation is turned into the text that the embedder sees.

MiniLM truncates at 256 word pieces, so *what* is rendered, and in which order, decides what the
embedding can know:

- ``window: all`` (the TRACER paper's choice) renders the whole conversation. Chronological order
  keeps the system prompt and the first turns and loses the latest request once the conversation
  passes ~256 word pieces; ``order: newest_first`` keeps the latest messages and loses the oldest.
- ``window: last_n`` renders the last ``n`` messages.
- ``window: since_user`` (our default) renders the latest user message plus the calls made since.
  It loses earlier turns entirely, which on BFCL is what helps: the latest request names the
  next tool far more often than the history does. With ``join_users: true`` it starts at the first
  of the latest run of consecutive user messages: a request left without a call (BFCL's
  clarification and withheld-function turns) is read together with the message that follows it,
  such as BFCL's placeholder "What about now?".

Tool calls are rendered as ``name(args)`` or ``name``; tool results are left out, truncated to
``result_chars`` characters, or kept whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tracer.core.types import Message

Window = Literal["all", "last_n", "since_user"]


@dataclass(frozen=True)
class ContextRendering:
    """Settings for rendering a conversation into one string.

    Args:
        window: which messages (``all``, ``last_n``, ``since_user``).
        n: message count for ``last_n``.
        order: ``chronological`` or ``newest_first``.
        calls: ``names`` or ``names_args`` (how an assistant tool call is shown), or ``none``.
        results: ``none``, ``truncated`` or ``full`` (how a tool result is shown).
        result_chars: characters kept of a result under ``truncated``.
        system: whether the system prompt is included.
        join_users: ``since_user`` only: start at the first of the latest run of consecutive user
            messages (user messages with no assistant message between them read as one request).
    """

    window: Window = "since_user"
    n: int = 5
    order: Literal["chronological", "newest_first"] = "chronological"
    calls: Literal["names", "names_args", "none"] = "names"
    results: Literal["none", "truncated", "full"] = "none"
    result_chars: int = 200
    system: bool = False
    join_users: bool = False

    def __post_init__(self):
        if self.window not in ("all", "last_n", "since_user"):
            raise ValueError(f"context window must be all, last_n or since_user, got {self.window!r}")
        if self.order not in ("chronological", "newest_first"):
            raise ValueError(f"context order must be chronological or newest_first, got {self.order!r}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> ContextRendering:
        return cls(**dict(cfg or {}))

    def select(self, messages: Sequence[Message]) -> list[Message]:
        msgs = [m for m in messages if self.system or m.get("role") != "system"]
        if self.window == "last_n":
            msgs = msgs[-self.n:] if self.n > 0 else []
        elif self.window == "since_user":
            last_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=0)
            if self.join_users:
                while last_user > 0 and msgs[last_user - 1].get("role") == "user":
                    last_user -= 1
            msgs = msgs[last_user:]
        return msgs

    def render(self, messages: Sequence[Message]) -> str:
        parts = [p for p in (self._render_one(m) for m in self.select(messages)) if p]
        if self.order == "newest_first":
            parts.reverse()
        return "\n".join(parts)

    def _render_one(self, m: Message) -> str:
        role = m.get("role")
        content = m.get("content") or ""
        if not isinstance(content, str):  # content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        if role == "tool":
            if self.results == "none":
                return ""
            text = content if self.results == "full" else content[: self.result_chars]
            return f"result: {text}"
        if role == "assistant":
            out = [content] if content else []
            if self.calls != "none":
                for call in m.get("tool_calls") or ():
                    fn = call.get("function", call)
                    if self.calls == "names":
                        out.append(f"call {fn['name']}")
                    else:
                        args = fn.get("arguments", "")
                        if not isinstance(args, str):
                            args = json.dumps(args)
                        out.append(f"call {fn['name']}({args})")
            return "assistant: " + "; ".join(out) if out else ""
        return f"{role}: {content}" if content else ""
