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
req_cos        with ``semantic``: the cosine of the request alone with the tool (the index's encoder)
req_open       with ``semantic``: the tool's best cosine with a part of the request the turn's calls have
               not done yet (:mod:`tracer.scorers.tracer_plus.clauses`; 0 once every part is done)
req_open_top   with ``semantic``: 1 if the tool is among the top ``clause_top`` matches of an open part
               (cosine > 0)
============== =================================================================================

With ``candidates: m`` the request's top m BM25 matches join the candidate set (a lexical key beside the
vector key), and with ``semantic`` the best matches of the open parts join it too (a semantic key), so the
model can choose the request's best match even where neither the tries nor the vector search proposed it.

With ``open_slot`` (and ``semantic``), once the turn has made a call, the best match of each part of the
request still open claims a reserved slot, first part first, in turn with the novel slots' claimants (the
last slots, :func:`tracer.scorer_base.ranking.reserved`): what the request still asks is shown even where the
logs' habit after the last call ranks it low. The first slots stay the model's, so recall@1 does not move.

One definition for both paths: :meth:`RequestInput.rows` fills one step's rows in numpy, called row by row
by the batched builder and once by the live step, so the two agree bit for bit given the same embeddings
(a batch embeds its requests in one encoder call, the live step its one request, as the contexts are).
Tokens and BM25 are the ``bm25`` scorer's (:mod:`tracer.scorers.bm25`). The semantic evidence costs one
encoder call per new live request (its whole text and its clauses), cached per request text like the BM25
pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from itertools import zip_longest

import numpy as np

from tracer.core.context import ContextRendering
from tracer.core.types import Step
from tracer.scorers.bm25 import BM25Scorer, query_text, tokens
from tracer.scorers.tracer_plus.clauses import open_clauses, split_clauses
from tracer.scorers.tracer_plus.zero_shot import top_ids

REQUEST_FEATURES = ("req_bm25", "req_top", "req_name", "never_called")
SEMANTIC_FEATURES = ("req_cos", "req_open", "req_open_top")
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
    sem: np.ndarray | None = None    # [B, N, 3] float32 req_cos, req_open, req_open_top (``semantic``)
    claims: list[tuple[int, ...]] | None = None  # B tuples: the open parts' best matches (``open_slot``)

    def take(self, rows: Sequence[int]) -> RequestInput:
        rows = list(rows)
        return RequestInput(self.bm25[rows], self.top[rows], [self.words[i] for i in rows], self.names,
                            None if self.sem is None else self.sem[rows],
                            None if self.claims is None else [self.claims[i] for i in rows])

    def reserve(self, novel: Sequence[tuple[int, ...]] | None) -> list[tuple[int, ...]] | None:
        """Per step, the ids claiming the reserved slots: the novel claimants ``novel`` (None: no novel
        slots) and the open parts' best matches taken in turn, a novel one first, each id once; None when
        neither claims. Neither kind of exploration crowds the other out of the slots: with two slots and
        claimants of both kinds, each kind has one."""
        if self.claims is None:
            return None if novel is None else list(novel)
        if novel is None:
            return list(self.claims)
        return [tuple(dict.fromkeys(t for pair in zip_longest(n, c) for t in pair if t is not None))
                for c, n in zip(self.claims, novel)]

    def __len__(self) -> int:
        return len(self.words)

    @property
    def features(self) -> tuple[str, ...]:
        """The names of the columns :meth:`rows` fills."""
        return REQUEST_FEATURES + (SEMANTIC_FEATURES if self.sem is not None else ())

    def rows(self, i: int, tool: np.ndarray, never: np.ndarray) -> np.ndarray:
        """``[C, R]`` float32 request features of step ``i``'s candidates ``tool [C]`` (``never [N]`` bool:
        the tools no logged step called), in :attr:`features` order."""
        scores = self.bm25[i]                                                              # [N]
        best = scores.max() if len(scores) else np.float32(0)
        out = np.zeros((len(tool), len(self.features)), dtype=np.float32)
        if best > 0:
            out[:, 0] = scores[tool] / best
        out[:, 1] = self.top[i, tool]
        words, names = self.words[i], self.names
        out[:, 2] = [len(names[t] & words) / len(names[t]) if names[t] else 0.0 for t in tool.tolist()]
        out[:, 3] = never[tool]
        if self.sem is not None:
            out[:, 4:] = self.sem[i, tool]
        return out


class RequestEvidence:
    """Request features and the request's BM25 key (module docstring).

    Args:
        candidates: m, how many of the request's best BM25 matches join the candidates (0: none).
        bm25: ``{k1, b}`` of the request's BM25.
        semantic: the request's own embedding and its open parts as features, the open parts' best matches
            as candidates (false for an index saved before them).
        clause_top: how many of each open part's best matches join the candidates (``req_open_top``).
        open_slot: once the turn has made a call, the best match of each open part claims a reserved slot
            (module docstring; needs ``semantic``).
    """

    def __init__(self, candidates: int = 10, bm25: Mapping | None = None, semantic: bool = False,
                 clause_top: int = 2, open_slot: bool = False):
        for name, value in (("candidates", candidates), ("clause_top", clause_top)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"request.{name} must be an int >= 0, got {value!r}")
        for name, value in (("semantic", semantic), ("open_slot", open_slot)):
            if not isinstance(value, bool):
                raise TypeError(f"request.{name} must be true or false, got {value!r}")
        if open_slot and not semantic:
            raise ValueError("request.open_slot needs request.semantic: the encoder finds the open parts")
        self.m, self.semantic, self.clause_top, self.open_slot = candidates, semantic, clause_top, open_slot
        self.bm25_cfg = dict(bm25 or {"k1": 1.5, "b": 0.75})
        self._lexical = None   # (registry, cached evidence of a text, name words [N]), built on first use
        self._embedded = None  # (embedder, tool vectors, cached embedding cosines of a text)

    @classmethod
    def from_config(cls, cfg: Mapping | None) -> RequestEvidence | None:
        """None (an index saved before request features, or ``request: null``): no request evidence."""
        return None if cfg is None else cls(**dict(cfg))

    def config(self) -> dict:
        return {"candidates": self.m, "bm25": dict(self.bm25_cfg), "semantic": self.semantic,
                "clause_top": self.clause_top, "open_slot": self.open_slot}

    @property
    def features(self) -> tuple[str, ...]:
        return REQUEST_FEATURES + (SEMANTIC_FEATURES if self.semantic else ())

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

    def _cosines(self, res) -> Callable[[Sequence[str]], list[tuple[np.ndarray, np.ndarray]]]:
        """Request texts -> each one's (whole cosine [N], clause cosines [J, N]) under ``res``'s encoder; a
        single text (the live path) is cached, a batch (a fit, an evaluation) is embedded in one call."""
        encoder, tools = res.embedder, res.tool_index.vectors  # an inner fold's clean encoder is another one
        if self._embedded is None or self._embedded[0] is not encoder or self._embedded[1] is not tools:
            tools64 = tools.astype(np.float64)                                           # [N, d]
            batch = partial(_request_cosines, encoder, tools64)
            # a request's cosines: about 4 texts (the whole and its clauses) of 4 bytes a tool
            size = max(16, min(4096, CACHE_BYTES // (4 * 4 * max(len(res.registry), 1))))
            one = lru_cache(maxsize=size)(lambda text: batch([text])[0])

            def cosines(texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
                if len(texts) == 1:
                    return [one(texts[0])]
                unique = list(dict.fromkeys(texts))
                found = dict(zip(unique, batch(unique)))
                return [found[t] for t in texts]
            self._embedded = (encoder, tools, cosines)
        return self._embedded[2]

    def _semantic(self, steps: Sequence[Step], texts: Sequence[str], res
                  ) -> tuple[np.ndarray, list[tuple[int, ...]]]:
        """(``[B, N, 3]`` float32 req_cos, req_open and req_open_top of each step; each step's open-part
        claimants, empty before the turn's first call) (module docstring)."""
        cosines = self._cosines(res)(texts)
        out = np.zeros((len(steps), len(res.registry), len(SEMANTIC_FEATURES)), dtype=np.float32)
        claims: list[tuple[int, ...]] = []
        tops: dict[str, list[np.ndarray]] = {}  # each clause's best matches, once per request text
        for i, (step, text, (whole, parts)) in enumerate(zip(steps, texts, cosines)):   # [N], [J, N]
            out[i, :, 0] = whole
            if text not in tops:  # a match, not a tie at 0 won by registry order
                tops[text] = [ids[row[ids] > 0] for row in parts for ids in [top_ids(row, self.clause_top)]]
            called = [t for t in map(res.registry.positions.get, step.prefix) if t is not None]
            open_ = open_clauses(parts, called)                                          # [J]
            claim: list[int] = []
            if open_.any():
                out[i, :, 1] = parts[open_].max(0)
                for j in np.flatnonzero(open_):
                    ids = tops[text][j]
                    out[i, ids, 2] = 1.0
                    if called and len(ids) and int(ids[0]) not in claim:
                        claim.append(int(ids[0]))
            claims.append(tuple(claim))
        return out, claims

    def inputs(self, steps: Sequence[Step], res) -> RequestInput:
        """BM25 scores, top-m flags and words of each step's request (and its semantic evidence)."""
        one, names = self._registry(res)
        n = len(res.registry)
        texts = [query_text(REQUEST_RENDERING, s) for s in steps]
        parts = [one(text) for text in texts]
        sem, claims = self._semantic(steps, texts, res) if self.semantic else (None, None)   # [B, N, 3]
        claims = claims if self.open_slot else None
        if not parts:
            return RequestInput(np.zeros((0, n), np.float32), np.zeros((0, n), bool), [], names, sem, claims)
        top = np.stack([p[1] for p in parts])                                                         # [B, N]
        if sem is not None:  # the open parts' best matches join the candidates: a semantic key
            top = top | (sem[:, :, 2] > 0)
        return RequestInput(np.stack([p[0] for p in parts]), top, [p[2] for p in parts], names, sem, claims)


def _request_cosines(embedder, tools: np.ndarray,
                     texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each request text's (cosine of the whole request [N], of each of its clauses [J, N]) with the tools
    ``[N, d]`` (normalised, float64): every text and clause embedded in one encoder call; read-only arrays,
    shared by the cache."""
    if not texts:
        return []
    clauses = [split_clauses(text) for text in texts]
    flat = [t for text, parts in zip(texts, clauses) for t in (text, *parts)]
    q = embedder.encode(flat).detach().cpu().numpy().astype(np.float64)                # [T, d]
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    cos = (q @ tools.T).astype(np.float32)                                               # [T, N]
    cos.flags.writeable = False
    out, row = [], 0
    for parts in clauses:
        out.append((cos[row], cos[row + 1:row + 1 + len(parts)]))
        row += 1 + len(parts)
    return out
