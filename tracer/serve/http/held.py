"""The registry held by the gateway (``tracer serve --tools-from-index``): a client sends no tool schemas, or
only its own additions, and the gateway chooses among the index's registry and those.

At tens of thousands of tools a request that carries every schema is megabytes (BFCL's function documents
average ~600 bytes), parsed and validated on each call. With the registry held, the candidates of a request
are the index's tools (their schemas as saved with the index, ``tools.json``) followed by the request's own:
a request tool with the name of an index tool replaces that tool's schema (the client's definition is the
current one), any other is an addition, ranked as the gateway ranks a tool the index does not know. A request
with ``tool_choice: "none"`` gets no tools. The upstream receives the k chosen schemas only.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tracer.retriever import Retriever


class IndexTools:
    """The index's registry as OpenAI tool objects and names, built once per loaded index (a reload makes a
    new retriever, and with it a new list)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._for: Retriever | None = None
        self._tools: list[dict[str, Any]] = []
        self._names: list[str] = []

    def of(self, retriever: Retriever) -> tuple[list[dict[str, Any]], list[str]]:
        with self._lock:
            if self._for is not retriever:
                self._tools = [t.to_openai() for t in retriever.registry]
                self._names = [t.name for t in retriever.registry]
                self._for = retriever
            return self._tools, self._names


def candidates(
    index_tools: Sequence[dict[str, Any]],
    index_names: Sequence[str],
    request_tools: Sequence[Mapping[str, Any]],
    request_names: Sequence[str],
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The tools a request chooses among when the registry is held, in canonical order (the index's order,
    then the request's additions in its order), and their names."""
    if not request_tools:
        return list(index_tools), list(index_names)
    own = dict(zip(request_names, request_tools))
    known = set(index_names)
    tools = [own.get(n, t) for t, n in zip(index_tools, index_names)]
    extra = [(t, n) for t, n in zip(request_tools, request_names) if n not in known]
    return tools + [t for t, _ in extra], list(index_names) + [n for _, n in extra]
