"""The BM25 baseline (``scorer=bm25``) against BM25 computed here by hand, on the tiny registry.

Lucene's BM25 (bm25s's default): for a query word w in a tool's text d,
``idf(w) = ln(1 + (N - df + 0.5) / (df + 0.5))`` and ``tf(w, d) / (tf(w, d) + k1 (1 - b + b |d| / avgdl))``,
summed over the query's words (a word repeated in the query counts each time)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from builders import TINY_TOOLS
from test_baselines import step

from tracer.build import build_scorer
from tracer.core.types import Tool
from tracer.scorer_base.ranking import finalize
from tracer.scorers.bm25 import query_text, tokens, tool_text


def by_hand(query: list[str], docs: list[list[str]], k1: float = 1.5, b: float = 0.75) -> list[float]:
    n, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    out = []
    for d in docs:
        s = 0.0
        for w in query:
            df = sum(w in x for x in docs)
            tf = d.count(w)
            if df and tf:
                s += math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
        out.append(s)
    return out


def test_identifiers_split_at_snake_and_camel_case_and_stopwords_go():
    assert tokens("getStockInfo") == tokens("get_stock_info") == ["get", "stock", "info"]
    assert tokens("parseHTTPResponse for the userID2") == ["parse", "http", "response", "user", "id2"]
    assert tokens("") == [] and tokens("the of and") == []


def test_a_tools_text_holds_its_parameters_names_and_descriptions():
    tool = Tool(
        "send_email",
        "Send an email",
        {
            "type": "object",
            "properties": {
                "recipientAddress": {"type": "string", "description": "who gets it"},
                "attachments": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"fileName": {"type": "string"}}},
                },
            },
        },
    )
    assert tokens(tool_text(tool)) == [
        "send",
        "email",
        "send",
        "email",
        "recipient",
        "address",
        "who",
        "gets",
        "attachments",
        "file",
        "name",
    ]


def test_rankings_are_bm25_by_hand_and_ties_keep_registry_order(tiny_resources):
    scorer = build_scorer("bm25")
    scorer.fit([], tiny_resources)
    docs = [tokens(tool_text(t)) for t in TINY_TOOLS]
    queries = [
        "Book a flight for me",
        "What's the weather forecast in Oslo?",
        "cancel my booking by id",
        "zzz qqq",
    ]
    steps = [step((), q) for q in queries]
    sc = scorer.score(steps)
    for row, st in zip(sc.fallback, steps):
        rendered = scorer.query.render(st.context)  # the query: the context as vector search renders it
        assert rendered.startswith("user: ")
        query = tokens(
            rendered.removeprefix("user: ")
        )  # its line label is structure, not a word of the query
        assert row.tolist() == pytest.approx(by_hand(query, docs), rel=1e-5, abs=1e-6)
    ranking = finalize(sc, k=3).ranking
    names = [[TINY_TOOLS[i].name for i in r[:3].tolist()] for r in ranking]
    assert names[0][:2] == ["book_flight", "search_flights"]
    assert names[1][0] == "get_weather" and names[2][0] == "cancel_booking"
    assert names[3] == [t.name for t in TINY_TOOLS[:3]]  # no known word: all 0, registry order


def test_the_query_drops_the_renderings_line_labels_not_the_words():
    scorer = build_scorer("bm25")
    first = step(("search_flights",), "List the user accounts", position=1)
    ctx = replace(
        first,
        context=first.context
        + (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c0",
                        "type": "function",
                        "function": {"name": "search_flights", "arguments": "{}"},
                    }
                ],
            },
        ),
    )
    assert tokens(query_text(scorer.query, ctx)) == ["list", "user", "accounts", "search", "flights"]
