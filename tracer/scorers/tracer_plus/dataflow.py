"""What a lookup feeds, read from the registry's schemas alone: a zero-shot ranking for the step after one.

At a cold start many misses follow a lookup: the agent finds the user's id (``find_user_id_by_email``), then
needs the tool that takes it (``get_user_details(user_id)``), which nothing in the request names; the same
holds for a token fetched before the request it authorises (API-Bank's ``GetUserToken``, then any tool with
a ``token``). What names that tool is the schema: an *identifier parameter* (its last word ``id``, ``ids``,
``token``, ``key`` or ``uuid``) whose other words the lookup's name carries. :class:`Dataflow` holds these
edges within each named toolkit (``Tool.source``), from a lookup (a name that starts with ``get``, ``find``,
``search``, ...) to the tools that consume what it looked up;
:func:`tracer.scorers.tracer_plus.zero_shot.dataflow_rrf` ranks, for each step, the consumers of the
conversation's last call by vector score, one more list of the zero-shot fusion.

Measured at N = 0 (``experiments/studies/general_encoder``, answer 4): tau2 recall@5 +0.059, API-Bank
+0.007, BFCL unchanged (its lookups yield no identifier another tool takes). Tried and dropped, each worse
on BFCL or API-Bank (uncommitted variants): edges through any parameter (``stock`` after
``get_stock_info``), edges from any tool, not only lookups, and the reverse direction (the lookups the
fusion's leader needs). Tool graphs from schemas rather than logs: Lumer et al., *Graph RAG-Tool Fusion*
(2025), who annotate the dependencies by hand.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tracer.scorers.bm25 import tokens

# the last word of an identifier parameter: the value a lookup yields and another tool takes
IDENTIFIERS = frozenset({"id", "ids", "token", "key", "uuid"})
# words that name no object: an id of what, the name of what
GENERIC = frozenset({"id", "ids", "key", "uuid", "name", "names", "new", "num", "number", "type", "list",
                     "info", "details", "detail", "data", "value", "values", "by"})
# the first word of a lookup's name: its other words name what it yields
LOOKUPS = frozenset({"get", "find", "search", "list", "query", "check", "lookup", "fetch", "retrieve",
                     "show", "read", "describe"})


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def identifier_words(tool) -> set[str]:
    """The object words of ``tool``'s identifier parameters (``user_id`` -> user, ``token`` -> token): the
    schema's required parameters, else all of its top-level properties."""
    schema = tool.parameters if isinstance(tool.parameters, Mapping) else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
    listed = schema.get("required")
    required = [p for p in listed if isinstance(p, str)] if isinstance(listed, (list, tuple)) else []
    words: set[str] = set()
    for param in required or [str(p) for p in props]:
        if (ws := tokens(param)) and ws[-1] in IDENTIFIERS:
            words |= {_stem(w) for w in ws} - GENERIC
    return words


def looked_up(tool) -> set[str]:
    """What ``tool`` yields when it is a lookup (``find_user_id_by_email`` -> user, email;
    ``GetUserToken`` -> user, token); empty for any other tool."""
    words = tokens(tool.name)
    return {_stem(w) for w in words[1:]} - GENERIC if words and words[0] in LOOKUPS else set()


class Dataflow:
    """``consumers[a]``: the tool ids ``[m]`` int64 (registry order) of ``a``'s toolkit that take what the
    lookup ``a`` yields through an identifier parameter (module docstring); empty for a tool that is no
    lookup or has no named toolkit."""

    def __init__(self, registry):
        taking: dict[tuple[str, str], set[int]] = {}  # (toolkit, word): the tools taking an identifier of it
        for i, tool in enumerate(registry):
            for word in identifier_words(tool) if tool.source else ():
                taking.setdefault((tool.source, word), set()).add(i)
        empty = np.zeros(0, np.int64)
        self.consumers = [empty] * len(registry)
        for a, tool in enumerate(registry):
            ids = set().union(*(taking.get((tool.source, w), ()) for w in looked_up(tool))) - {a}
            if ids:  # a tool without a toolkit takes part in no edge: ``taking`` has none of its keys
                self.consumers[a] = np.asarray(sorted(ids), dtype=np.int64)
