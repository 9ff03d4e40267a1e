"""Request evidence for tracer_plus's candidate model: what the request asks, whatever the logs say.

The tries and the tool memories say what the logs did after a state like this one. Where the logs have a
strong habit (BFCL: ``cd`` is followed by ``mv`` 44 times and by ``ls`` 4 times) a model that sees only them
follows the habit even when the request asks for the rare tool ("show me what files are there"), and a tool
no log has called has no trie feature at all. These features say what the request itself asks, from the
request's own words, so the model can learn from the data when the logs should yield:

============== =================================================================================
feature        meaning
============== =================================================================================
req_bm25       BM25 of the request (the latest user message, or run of user messages, alone: no
               calls, no results) against the tool's text, divided by the step's best BM25 score
               (1 for the request's best lexical match, 0 where no word matches)
req_top        1 if the tool is among the request's top ``candidates`` BM25 matches (score > 0)
req_name       the share of the words of the tool's name that the request uses (``get_weather``
               and "what's the weather": 0.5; "run ls": 1 for ``ls``)
never_called   1 if no logged step of the index called the tool (no trie or memory evidence)
============== =================================================================================

With ``candidates: m`` the request's top m BM25 matches join the candidate set (a lexical key beside the
vector key), so the model can choose the request's best match even where neither the tries nor the vector
search proposed it.

One definition for both paths: :meth:`RequestInput.rows` fills one step's rows in numpy, called row by row
by the batched builder and once by the live step, so the two agree bit for bit. Tokens and BM25 are the
``bm25`` scorer's (:mod:`tracer.scorers.bm25`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np

from tracer.core.context import ContextRendering
from tracer.core.types import Step
from tracer.scorers.bm25 import BM25Scorer, query_text, tokens
from tracer.scorers.tracer_plus.zero_shot import top_ids

REQUEST_FEATURES = ("req_bm25", "req_top", "req_name", "never_called")
CACHE_BYTES = 16 * 2**20  # what the cached requests' evidence may hold (at most 4,096 requests)
# the request alone: the latest run of user messages, no calls or results (their names would match the tools
# already called, which the history features already say)
REQUEST_RENDERING = ContextRendering(window="since_user", calls="none", results="none", join_users=True)


@dataclass
class RequestInput:
    """The request evidence of B steps, computed once per step and read by both candidate paths."""

    bm25: np.ndarray                 # [B, N] float32 BM25 of each step's request against each tool's text
    top: np.ndarray                  # [B, N] bool: among the request's top m BM25 matches with a score > 0
    words: list[frozenset[str]]      # B sets: the request's tokens
    names: list[frozenset[str]]      # N sets: the words of each tool's name (the registry's, shared)

    def take(self, rows: Sequence[int]) -> RequestInput:
        rows = list(rows)
        return RequestInput(self.bm25[rows], self.top[rows], [self.words[i] for i in rows], self.names)

    def __len__(self) -> int:
        return len(self.words)

    def rows(self, i: int, tool: np.ndarray, never: np.ndarray) -> np.ndarray:
        """``[C, 4]`` float32 request features of step ``i``'s candidates ``tool [C]`` (``never [N]`` bool:
        the tools no logged step called), in :data:`REQUEST_FEATURES` order."""
        scores = self.bm25[i]                                                              # [N]
        best = scores.max() if len(scores) else np.float32(0)
        out = np.zeros((len(tool), len(REQUEST_FEATURES)), dtype=np.float32)
        if best > 0:
            out[:, 0] = scores[tool] / best
        out[:, 1] = self.top[i, tool]
        words, names = self.words[i], self.names
        out[:, 2] = [len(names[t] & words) / len(names[t]) if names[t] else 0.0 for t in tool.tolist()]
        out[:, 3] = never[tool]
        return out


class RequestEvidence:
    """Request features and the request's BM25 key (module docstring).

    Args:
        candidates: m, how many of the request's best BM25 matches join the candidates (0: none).
        bm25: ``{k1, b}`` of the request's BM25.
    """

    def __init__(self, candidates: int = 10, bm25: Mapping | None = None):
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 0:
            raise ValueError(f"request.candidates must be an int >= 0, got {candidates!r}")
        self.m = candidates
        self.bm25_cfg = dict(bm25 or {"k1": 1.5, "b": 0.75})
        self._lexical = None  # (registry, BM25Scorer, name words [N]), built on first use

    @classmethod
    def from_config(cls, cfg: Mapping | None) -> RequestEvidence | None:
        """None (an index saved before request features, or ``request: null``): no request evidence."""
        return None if cfg is None else cls(**dict(cfg))

    def config(self) -> dict:
        return {"candidates": self.m, "bm25": dict(self.bm25_cfg)}

    def _registry(self, res) -> tuple[Callable[[str], tuple], list[frozenset[str]]]:
        """(one request text's evidence, cached; the words of each tool's name) for ``res``'s registry."""
        if self._lexical is None or self._lexical[0] is not res.registry:
            scorer = BM25Scorer(name="bm25", context=vars(REQUEST_RENDERING), **self.bm25_cfg)
            scorer.fit([], res)
            names = [frozenset(tokens(t.name)) for t in res.registry]
            # every step of a turn reads the same request (no call names in its rendering): one BM25 pass a
            # request, not a step, on the live path and in a fit alike
            size = max(16, min(4096, CACHE_BYTES // (5 * max(len(res.registry), 1))))  # 5 bytes a tool
            one = lru_cache(maxsize=size)(partial(self._evidence, scorer))
            self._lexical = (res.registry, one, names)
        return self._lexical[1], self._lexical[2]

    def _evidence(self, scorer: BM25Scorer, text: str) -> tuple[np.ndarray, np.ndarray, frozenset[str]]:
        """(BM25 scores [N] float32, top-m flags [N] bool, words) of one request text; read-only, shared by
        the cache."""
        words = tokens(text)
        scores = scorer.query_scores(words).astype(np.float32)                           # [N]
        top = np.zeros(len(scores), dtype=bool)                                           # [N]
        ids = top_ids(scores, self.m)
        top[ids[scores[ids] > 0]] = True
        scores.flags.writeable = top.flags.writeable = False
        return scores, top, frozenset(words)

    def inputs(self, steps: Sequence[Step], res) -> RequestInput:
        """BM25 scores, top-m flags and words of each step's request."""
        one, names = self._registry(res)
        n = len(res.registry)
        parts = [one(query_text(REQUEST_RENDERING, s)) for s in steps]
        if not parts:
            return RequestInput(np.zeros((0, n), np.float32), np.zeros((0, n), bool), [], names)
        return RequestInput(np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]),        # [B, N]
                            [p[2] for p in parts], names)
