"""Which of a request's tools the gateway presents, and in what order.

**Choosing k tools** (:func:`choose`). The request carries its full ``tools``; the index ranks the
conversation (:meth:`Retriever.rank`). Tools the index knows but the request omits are never
presented. Tools in the request that the index does not know are ranked by vector search: their
name and description (:attr:`Tool.search_text`) are embedded once and cached, and compared by cosine
with the conversation's context embedding. The rule that merges the two:

    an unknown tool takes a slot when plain vector search over all the request's tools would
    present it (its cosine is among the k best, known tools scored by the index's own tool
    vectors); the remaining slots go to the index's ranking of the known tools.

So an index trained without a tool never hides it when the conversation plainly asks for it, and
never lets untrained tools crowd out what it learned. A tool named by ``tool_choice`` is always kept.

**Prompt-cache-stable presentation** (:class:`StickyPresenter`). Within a conversation, tools already
presented stay where they are and newly chosen ones are appended in canonical order (their order in
the request's ``tools``, which an agent keeps fixed), so the tool block of the prompt only grows at its
end and a provider's prefix cache keeps hitting. The set is capped at ``max_presented``; beyond it the
conversation restarts from the current choice (one cache break). Plain mode presents the top k in
rank order at every step.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tracer.core.types import Message, Tool
from tracer.encode.embedders import encode_tools
from tracer.retriever import Retriever


def tool_name(obj: Mapping[str, Any]) -> str:
    return obj["function"]["name"]


class UnknownToolVectors:
    """Embeddings of tools the index does not know, by search text (embedded once, bounded LRU)."""

    def __init__(self, max_size: int = 65536):
        self.max_size = max_size
        self._vecs: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, retriever: Retriever, tools: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """``[U, d]`` float32 rows for ``tools`` (OpenAI tool objects)."""
        texts = [Tool.from_openai(t).search_text for t in tools]
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._vecs]
        if missing:
            vecs = encode_tools(retriever.res.embedder, missing).numpy().astype(np.float32)  # [M, d]
            with self._lock:
                for t, v in zip(missing, vecs):
                    self._vecs[t] = v
                while len(self._vecs) > self.max_size:
                    self._vecs.popitem(last=False)
        with self._lock:
            rows = [self._vecs[t] for t in texts]
        return np.stack(rows) if rows else np.zeros((0, retriever.res.embedder.dim), np.float32)


def forced_name(tool_choice: Any) -> str | None:
    """The tool a ``tool_choice`` object names (``{"type": "function", "function": {"name": ...}}``), else None."""
    if isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("function"), Mapping):
        name = tool_choice["function"].get("name")
        return name if isinstance(name, str) else None
    return None


def choose(retriever: Retriever, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], k: int,
           unknown_vectors: UnknownToolVectors, must: str | None = None,
           names: Sequence[str] | None = None) -> list[str]:
    """Names of the k request tools to present, best first (see the module docstring for the rule).

    ``names``: the tools' names when the caller has them already (the gateway's validation does).
    """
    names = [tool_name(t) for t in tools] if names is None else list(names)
    if len(names) <= k:
        return names
    registry = retriever.registry
    known = registry.positions
    requested = set(names)
    known_ranked = [n for n in retriever.rank(messages) if n in requested]
    unknown = [] if requested.issubset(known.keys()) else [t for t, n in zip(tools, names) if n not in known]
    chosen_unknown: list[str] = []
    if unknown:
        ctx = retriever.context_embedding(messages).astype(np.float64)               # [d]
        known_ids = [registry.id(n) for n in known_ranked]
        known_vecs = retriever.res.tool_index.vectors[known_ids]                     # [K, d]
        vecs = np.concatenate([known_vecs, unknown_vectors.get(retriever, unknown)])  # [K + U, d]
        cos = vecs.astype(np.float64) @ ctx                                          # [K + U]
        order = np.argsort(-cos, kind="stable")[:k]                                   # ties: known first
        chosen_unknown = [tool_name(unknown[i - len(known_ids)]) for i in order.tolist() if i >= len(known_ids)]
    chosen = known_ranked[:k - len(chosen_unknown)] + chosen_unknown
    if must is not None and must in requested and must not in chosen:
        chosen = [must] + chosen[:k - 1]
    return chosen


class StickyPresenter:
    """Per-conversation presented lists (LRU over ``max_conversations`` conversations).

    Args:
        sticky: keep presented tools in place and append new ones (False: the choice in rank order).
        max_presented: cap on a conversation's presented list (None: no cap).
    """

    def __init__(self, sticky: bool = True, max_presented: int | None = None, max_conversations: int = 10000):
        self.sticky = sticky
        self.max_presented = max_presented
        self.max_conversations = max_conversations
        self._state: OrderedDict[str, list[str]] = OrderedDict()
        self._lock = threading.Lock()

    def present(self, conversation: str, chosen: Sequence[str], canonical: Sequence[str]) -> list[str]:
        """The names to present now, given this step's choice and the request's canonical tool order."""
        if not self.sticky:
            return list(chosen)
        position = {n: i for i, n in enumerate(canonical)}
        with self._lock:
            before = self._state.pop(conversation, [])
            kept = [n for n in before if n in position]  # a tool the request dropped is never presented
            new = sorted((n for n in set(chosen) - set(kept)), key=position.__getitem__)
            shown = kept + new
            if self.max_presented is not None and len(shown) > self.max_presented:
                shown = sorted(chosen, key=position.__getitem__)
            self._state[conversation] = shown
            while len(self._state) > self.max_conversations:
                self._state.popitem(last=False)
        return shown


def conversation_id(messages: Sequence[Message], header: str | None = None) -> str:
    """The conversation a request belongs to: the ``X-Tracer-Conversation`` header when given, else a hash
    of the system message(s) and the first user message (what stays fixed as a conversation grows)."""
    if header:
        return header
    system = [m.get("content") for m in messages if m.get("role") == "system"]
    first_user = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    blob = json.dumps([system, first_user], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]
