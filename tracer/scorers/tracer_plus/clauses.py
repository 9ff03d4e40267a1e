"""The parts of a request, and which of them the turn's calls have not done yet.

A request often asks for several things in a row: "move into the documents folder and show me what files are
there". Once ``cd`` has been called, the part still open is "show me what files are there", and its best
match (``ls``) is what the next call most likely is, whatever the logs' habit after ``cd`` says (``mv``, 44
times to 4 on BFCL). The whole request's embedding cannot say this: it mixes the done part with the open one
and ranks ``ls`` 7th.

Splitting is deliberately plain (sentence ends, ``;`` and the connectives ``and``, ``then``, ``and then``,
``after that``, ``also``): a split inside a noun phrase ("salt and pepper") only costs a clause that matches
nothing better. A clause is served by a call when, among the clauses not yet served, that call's tool comes
closest to being the clause's best match (the smallest gap between its cosine and the clause's best cosine);
each call of the turn serves one clause, in call order.
"""

from __future__ import annotations

import re

import numpy as np

MAX_CLAUSES = 8  # a longer request keeps its first 7 clauses and reads the rest as one
_SPLIT = re.compile(r"(?<=[.!?;])\s+|,?\s+\b(?:and then|then|and|after that|also)\b\s+", re.IGNORECASE)


def split_clauses(text: str) -> list[str]:
    """The request's clauses, in order; the whole text when it has at most one clause of two or more words."""
    parts = [p.strip() for p in _SPLIT.split(text) if p and len(p.split()) >= 2]
    if len(parts) <= 1:
        return [text.strip()]
    if len(parts) > MAX_CLAUSES:
        parts = parts[:MAX_CLAUSES - 1] + [" ".join(parts[MAX_CLAUSES - 1:])]
    return parts


def open_clauses(cos: np.ndarray, called: list[int]) -> np.ndarray:
    """``[J]`` bool: the clauses no call of the turn has served (module docstring).

    ``cos [J, N]``: each clause's cosine with each tool; ``called``: registry ids of the turn's calls, in
    order (a tool outside the registry is left out by the caller)."""
    open_ = np.ones(len(cos), dtype=bool)
    if not len(cos):
        return open_
    best = cos.max(1)                                                                    # [J]
    for tool in called:
        if not open_.any():
            break
        gap = np.where(open_, cos[:, tool] - best, -np.inf)                              # [J]
        open_[int(np.argmax(gap))] = False
    return open_
