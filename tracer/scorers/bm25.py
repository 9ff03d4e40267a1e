"""``bm25``: the registry ranked by BM25 of the step's context against each tool's text (bm25s).

The lexical baseline of tool retrieval: it needs no logs and no encoder, and on tools never seen called it is
a strong zero-shot ranker (ToolRet, ACL 2025). A tool's text is its name, description, and its parameters'
names and descriptions; the query is the context rendered as ``vector`` renders it
(``tracer/configs/scorer/bm25.yaml``) without the rendering's line labels (``user:``, ``assistant: call``:
"user" is a word of many tool descriptions). Both are tokenised alike (:func:`tokens`): identifiers split at
``snake_case`` and ``camelCase`` boundaries, lower-cased, alphanumeric runs, bm25s's English stopwords removed
(no stemming: it would need another dependency). Scoring is bm25s's BM25 (Lucene's variant, ``k1`` and ``b``
from the config) over the registry; ranks are by score, ties (a query with no known word scores 0 everywhere)
in registry order.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import bm25s
import numpy as np
import torch
from bm25s.stopwords import STOPWORDS_EN

from tracer.core.context import ContextRendering
from tracer.core.types import Step, Tool, Trajectory
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.ranking import no_proposal
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources

# bm25s sets its own logger to DEBUG when imported, so every index build prints "Building index from tokens"
# whatever level the application chose; NOTSET hands the decision back to the application's logging config
logging.getLogger("bm25s").setLevel(logging.NOTSET)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[A-Za-z0-9]+")
_STOP = frozenset(STOPWORDS_EN)
# the rendering's line labels ("user: ...", "assistant: call search_flights"): structure, not words of the
# query
_LABELS = re.compile(r"^(?:user|assistant|tool|system|developer):(?: call)?", re.MULTILINE)


def tokens(text: str) -> list[str]:
    """Lower-cased words of ``text``, identifiers split (``getStockInfo``, ``get_stock_info`` -> get stock
    info), stopwords removed."""
    out = []
    for run in _WORD.findall(text):  # underscores and punctuation separate runs
        out += [w.lower() for w in _CAMEL.sub(" ", run).split()]
    return [w for w in out if w not in _STOP]


def tool_text(tool: Tool) -> str:
    """Name, description, and each parameter's name and description (nested objects' properties too)."""
    parts = [tool.name, tool.description]

    def walk(schema: Any) -> None:
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        for name, sub in (props or {}).items() if isinstance(props, Mapping) else ():
            parts.append(str(name))
            if isinstance(sub, Mapping):
                parts.append(str(sub.get("description", "")))
                walk(sub)
                walk(sub.get("items"))

    walk(tool.parameters)
    return " ".join(p for p in parts if p)


def query_text(rendering: ContextRendering, step: Step) -> str:
    """The step's context as ``rendering`` renders it, without its line labels (``user:``, ``assistant:
    call``)."""
    return _LABELS.sub("", rendering.render(step.context))


class BM25Scorer(ScorerBase):
    """The registry ranked by BM25 of the rendered context against each tool's text (module docstring).

    Args:
        name: registry name.
        context: rendering of the query (as ``vector``'s).
        k1, b: BM25's term-frequency saturation and length normalisation.
    """

    def __init__(self, *, name: str, context: Mapping, k1: float, b: float):
        self.name, self.k1, self.b = name, float(k1), float(b)
        self.query = ContextRendering.from_config(context)  # rendered to text, never embedded: no `rendering`
        self.res: Resources | None = None
        self.index: bm25s.BM25 | None = None

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        """Index the registry's tool texts; nothing is learned from the trajectories."""
        self.res = res
        self.index = bm25s.BM25(k1=self.k1, b=self.b)
        docs = [tokens(tool_text(t)) or ["\0"] for t in res.registry]  # an empty text still holds its row
        self.index.index(docs, show_progress=False)
        return FitReport(self.name, len(trajectories), 0, 0.0)

    def score(self, steps: Sequence[Step]) -> Scores:
        self._check_fitted()
        n = len(self.res.registry)
        fallback = torch.from_numpy(self.step_scores(steps))  # [B, N]
        return Scores(
            primary=no_proposal(len(steps), n),
            fallback=fallback,
            fell_back=torch.ones(len(steps), dtype=torch.bool),
        )

    def step_scores(self, steps: Sequence[Step]) -> np.ndarray:
        """``[B, N]`` float32 BM25 scores of the steps' rendered contexts."""
        rows = [self.query_scores(tokens(query_text(self.query, s))) for s in steps]  # B x [N]
        if not rows:
            return np.zeros((0, len(self.res.registry)), np.float32)
        return np.stack(rows).astype(np.float32)

    def query_scores(self, query: list[str]) -> np.ndarray:
        """``[N]`` BM25 scores of one tokenised query (all 0 for a query without a word)."""
        return self.index.get_scores(query) if query else np.zeros(len(self.res.registry), np.float32)

    def describe(self) -> dict:
        return {
            "scorer": self.name,
            "ranking": "BM25 of the context against tool name, description and parameters",
            "k1": self.k1,
            "b": self.b,
            "context": asdict(self.query),
        }
