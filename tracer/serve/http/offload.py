"""Where the gateway runs a request's selection: on the event loop, or off it in a worker thread when it must
embed tools the index does not know; and what it counts of it (the gateway's selection stage).

What is chosen and presented is :mod:`tracer.serve.selection`'s (:func:`~tracer.serve.selection.choose_tools`,
:class:`~tracer.serve.selection.StickyPresenter`), shared with ``tracer mcp``; here a request is narrowed to
its ``allowed_tools``, its selection scheduled, and the gateway's metrics counted.

Choosing costs well under a millisecond of CPU for a 128-tool request whose tools the index knows, and a
worker thread measured slower there (every hand-off waits for the GIL while the loop does I/O), so that
stays on the event loop. A request that must embed tools the index does not know (texts not in the
cache) would hold the loop for the whole encoding (seconds for hundreds of tools): it runs in a worker
thread, at most ``workers`` at once, while the loop keeps answering /health and other requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tracer.encode.embedders import tool_style
from tracer.retriever import Retriever
from tracer.serve.http.metrics import GatewayMetrics, Stopwatch
from tracer.serve.selection import (
    Keyed,
    StickyPresenter,
    UnknownToolVectors,
    allowed_names,
    choose_tools,
    forced_name,
)


class SelectionStage:
    """Args:
        k: tools presented per request.
        presenter: the gateway's per-conversation presented lists.
        unknown: vectors of tools the index does not know (its ``max_new`` caps the embedding per request).
        metrics: where ``tracer_selection_seconds``, ``tracer_lenient`` and ``tracer_unknown_tools`` go.
        workers: selections that embed running at once (the others wait, off the loop).
    """

    def __init__(self, k: int, presenter: StickyPresenter, unknown: UnknownToolVectors,
                 metrics: GatewayMetrics, workers: int = 2):
        self.k, self.presenter, self.unknown, self.metrics = k, presenter, unknown, metrics
        self._slots = asyncio.Semaphore(workers)

    async def __call__(self, retriever: Retriever, conv: str, body: dict[str, Any],
                       names: list[str], trial: bool = False) -> list[str]:
        """The names to present for this request: among the tools its ``allowed_tools`` tool_choice
        allows, when it has one and the request carries any of them
        (:func:`~tracer.serve.selection.allowed_names`). ``trial``: a step of a trial conversation, its
        choice widened (:func:`~tracer.serve.selection.choose_tools`)."""
        tools = body["tools"]
        allowed = allowed_names(body.get("tool_choice"))
        if allowed is not None and not set(allowed).isdisjoint(names):
            keep = set(allowed)
            tools = [t for t, n in zip(tools, names) if n in keep]
            names = [n for n in names if n in keep]
        known = retriever.registry.positions
        unknown = [t for t, n in zip(tools, names) if n not in known]
        keyed = Keyed.of(unknown, tool_style(retriever.res.embedder)) if unknown else None
        if keyed is not None and self.unknown.missing(keyed):
            async with self._slots:
                return await asyncio.to_thread(self._select, retriever, conv, body, tools, names, keyed,
                                               trial)
        return self._select(retriever, conv, body, tools, names, keyed, trial)

    def _select(self, retriever: Retriever, conv: str, body: dict[str, Any], tools: Sequence[dict[str, Any]],
                names: Sequence[str], keyed: Keyed | None = None, trial: bool = False) -> list[str]:
        with Stopwatch() as sw:
            choice = choose_tools(retriever, body["messages"], tools, self.k, self.unknown,
                                  forced_name(body.get("tool_choice")), names, keyed, trial)
            presented = self.presenter.present(conv, choice.names, names)
        self.metrics.selection.observe(sw.seconds)
        for kind, n in choice.lenient.items():
            self.metrics.lenient.labels(kind).inc(n)
        if choice.embedded:
            self.metrics.unknown_tools.labels("embedded").inc(choice.embedded)
        if choice.over_cap:
            self.metrics.unknown_tools.labels("over_cap").inc(choice.over_cap)
        return presented
