"""Prompt-cost counting (context-injection cost, CIC).

The prompt of a decision step is: system prompt (plus any guidance text a scorer adds), the
conversation so far, and the presented tool schemas as the model gets them (OpenAI tool objects,
JSON). Offline, tokens are counted with a tokenizer that ships offline: the WordPiece tokenizer of
all-MiniLM-L6-v2 (uncased BERT vocabulary), named ``minilm-wordpiece`` in reports. The count is the
sum over parts (each message, guidance inside the system prompt, and each tool schema), so per-part
counts are cached and a step costs a few dictionary lookups; chat-template tokens are not included. With an
endpoint executor, the server's reported ``prompt_tokens`` are used for ``cic_tokens`` instead.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

from tracer.encode.embedders import minilm_path

LOCAL_TOKENIZER = "minilm-wordpiece"


def message_text(m: Mapping[str, Any]) -> str:
    """A message as the model reads it: role, content, tool calls as JSON."""
    parts = [str(m.get("role", "")), str(m.get("content") or "")]
    if m.get("tool_calls"):
        parts.append(json.dumps(list(m["tool_calls"])))
    return "\n".join(parts)


class TokenCounter:
    """Counts tokens of prompt parts (messages, tool schemas) with a cache."""

    name = LOCAL_TOKENIZER

    def __init__(self):
        from transformers import AutoTokenizer  # heavy: only when counting

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.tok = AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)
        self.tok.model_max_length = 10**9  # counting, not encoding: no truncation warnings
        self._text: dict[str, int] = {}
        self._msg: dict[int, tuple[Any, int]] = {}

    def text(self, s: str) -> int:
        n = self._text.get(s)
        if n is None:
            n = self._text[s] = len(self.tok(s, add_special_tokens=False)["input_ids"]) if s else 0
        return n

    def message(self, m: Mapping[str, Any]) -> int:
        hit = self._msg.get(id(m))
        if hit is not None and hit[0] is m:
            return hit[1]
        n = self.text(message_text(m))
        self._msg[id(m)] = (m, n)  # keep m alive so its id is not reused
        return n

    def tool(self, tool_obj: Mapping[str, Any]) -> int:
        return self.text(json.dumps(tool_obj, sort_keys=True))
