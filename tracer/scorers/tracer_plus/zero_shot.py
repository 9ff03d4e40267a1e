"""What tracer_plus serves when its logs cannot be trusted: a zero-shot ranking, and the guard that picks it.

A learned combination must not do worse than the rankings it combines. With no logged call (a cold index) or
with too few for its candidate model (a handful of trajectories: the tries hold a few paths and the model
trusts them), tracer_plus serves a *zero-shot* ranking instead: ``vector`` (the query's cosine with each tool;
the behaviour before this module) or ``hybrid`` (vector search and BM25 fused by reciprocal rank,
:mod:`tracer.scorers.hybrid`).

The *guard* that picks between this ranking and the model, on complete logs and on a gateway's own, is
:mod:`tracer.scorers.tracer_plus.guard`.

*Novel tools* (``novel: j``, 0 = off): where the model serves, a tool no logged call has used has no trie
evidence, so the model ranks it below every tool it has seen called, even when the zero-shot ranking puts it
first: a step whose gold is such a tool is almost always missed. With ``novel`` on, the last ``slots``
presented slots (1 by default) go to the best of the top ``j`` tools that are never called and not presented
before them (:func:`tracer.scorer_base.ranking.reserved`); the ranking stays the model's. The top ``j`` of
which ranking is ``novel_from``: ``zero_shot`` (this fusion), ``vector`` (the query's cosine alone), ``bm25``
or ``hybrid`` (vector and BM25 fused, the lexical half untouched by what an encoder learned from logs). The
fusion's toolkit, previous-call and usage inputs all favour tools the logs have called, so a never-called tool
the request matches best is often first in the vector ranking and below the fusion's top 3: on BFCL's steps
whose tool no training log called, vector search puts the gold first or second in 8 of the 9 distinct cases.
With ``novel_toolkit: J`` (above ``j``), a never-called tool of the toolkit of the conversation's last call
claims from the wider top ``J``, before the others: the logs say that toolkit is in use, so its new tools are
the likely ones, while a tool of a toolkit no conversation is in (most of a large registry) needs the
request's top ``j``.

*The toolkit* (``toolkit: true``). Tools come in toolkits (``Tool.source``: an API family,
an MCP server), and a conversation mostly stays in the toolkit of its last call: after a conversation's first
call, 88% of BFCL's steps and every step of tau2 and API-Bank do (``python -m tracer.data.describe``,
docs/data.md). With ``toolkit`` on, the fusion gets a
third ranking: the tools of the toolkit of the conversation's last call that the registry knows, by vector
score (:func:`toolkit_rrf`). It needs no logs, so it is what a cold index most lacks; steps with no known
earlier call, or whose toolkit is unnamed (``source`` empty), are ranked as without it.

*The last call* (``calls: true``). An agent often calls the same tool again in a row (an order looked up,
then the next order): 28% of tau2's steps repeat the turn's previous call, 4% of BFCL's (``python -m
tracer.data.describe``). That call is moved up to second place (:func:`second_place`): always presented,
never in place of the fusion's first choice, which keeps recall@1 where repeats are rare. Ranking every
earlier call, or earlier turns' calls too, crowded out new tools on BFCL when tried.

*Dataflow* (``dataflow: true``). After a lookup (``find_user_id_by_email``), the tools of its toolkit that
take what it looked up through an identifier parameter (``get_user_details(user_id)``) are one more ranking
of the fusion, by vector score (:mod:`tracer.scorers.tracer_plus.dataflow`, read from the schemas alone).

*Usage* (``usage: c``). Once the logs hold calls, the fusion's vector input scores each called tool by the
query's cosine with its usage vector, its description vector plus the contexts of the logged steps that
called it (Tool2Vec; :mod:`tracer.scorer_base.usage`, ``c`` the description's weight): the logs' own phrasings
without any weight to learn, which is what a handful of logs can be trusted with. At fit time each training
step is scored with usage vectors built from the other inner folds only, so the guard compares the model
with what this ranking does on steps it has not seen. With no call it changes nothing.

*Candidates* (``candidates: true``). Where the model serves, its candidates are the tries' children and the
vector ranking's top m, each with the vector score, log rank and top-m flag as features. With ``candidates``
on, this fusion's top m join them and its score, log rank and top-m flag are three more features (group
``fusion``), so that BM25, the toolkit, the previous call and what a lookup feeds propose candidates and the
model learns their weight (off by default; on in ``preset/cold_start``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tracer.core.types import Step
from tracer.scorer_base.trial import check_rate
from tracer.scorer_base.usage import check_prior
from tracer.scorers.bm25 import BM25Scorer
from tracer.scorers.hybrid import rrf
from tracer.scorers.tracer_plus.dataflow import Dataflow
from tracer.scorers.tracer_plus.guard import Guard

KINDS = ("vector", "hybrid")
NOVEL_FROM = ("zero_shot", "vector", "bm25", "hybrid")


def top_ids(scores: np.ndarray, j: int) -> np.ndarray:
    """The ids of the ``j`` highest of ``scores [N]``, best first, ties by id: a stable argsort's first ``j``
    by partition, over the finite scores alone where there are j of them (no sort of the registry for the
    slot)."""
    j = min(j, len(scores))
    if j == 0:
        return np.zeros(0, np.int64)
    scored = np.flatnonzero(scores > -np.inf)  # over an approximate index most are -inf: partition the rest
    if j <= len(scored) < len(scores):
        return scored[top_ids(scores[scored], j)]
    v = np.partition(scores, len(scores) - j)[len(scores) - j]                  # the j-th highest value
    above, tied = np.flatnonzero(scores > v), np.flatnonzero(scores == v)
    ids = np.concatenate([above, tied[:j - len(above)]])
    return ids[np.lexsort((ids, -scores[ids]))]


def rrf_retrieved(vec: np.ndarray, lexical: np.ndarray | None, k: int, t: int) -> np.ndarray:
    """:func:`~tracer.scorers.hybrid.rrf` over an approximate tool index, where a step must not sort the
    registry: the vector ranking is the tools the index retrieved (finite in ``vec [B, N]``, best first, ties
    by registry position), the lexical one the top ``t`` of ``lexical [B, N]`` with a positive score (None:
    no lexical ranking); a tool in either gets ``sum 1 / (k + rank)`` over the lists it is in (float64, then
    float32), every other tool ``-inf``. ``[B, N]`` float32."""
    out = np.full(vec.shape, -np.inf, dtype=np.float32)
    for b, (row, v) in enumerate(zip(out, vec)):
        ids = np.flatnonzero(np.isfinite(v))
        ranks = [ids[np.lexsort((ids, -v[ids]))]]
        if lexical is not None:
            pos = np.flatnonzero(lexical[b] > 0)  # BM25 is 0 for most tools: partition only the scored ones
            ranks.append(pos[top_ids(lexical[b][pos], t)])
        fused: dict[int, float] = {}
        for ranked in ranks:
            for rank, tool in enumerate(ranked.tolist(), start=1):
                fused[tool] = fused.get(tool, 0.0) + 1.0 / (k + rank)
        if fused:
            row[list(fused)] = np.fromiter(fused.values(), dtype=np.float64, count=len(fused))
    return out


def toolkits(registry) -> dict[str, np.ndarray]:
    """Tool ids ``[n_s]`` (registry order) of each named toolkit (``Tool.source``; empty: none). A toolkit
    holding every tool tells nothing (its ranking would only count the vector ranking twice): left out."""
    groups: dict[str, list[int]] = {}
    for i, tool in enumerate(registry):
        if tool.source:
            groups.setdefault(tool.source, []).append(i)
    return {kit: np.asarray(ids, dtype=np.int64) for kit, ids in groups.items() if len(ids) < len(registry)}


def last_known_call(step: Step, positions: Mapping[str, int]) -> int | None:
    """The registry id of the step's last call the registry knows (``positions``: name -> id), or None."""
    return next((positions[h] for h in reversed(step.history) if h in positions), None)


def last_call_rrf(steps: Sequence[Step], vec: np.ndarray, registry,
                  following: Callable[[int], np.ndarray | None], k: int) -> np.ndarray:
    """A ranking keyed by the conversation's last call as its share of a reciprocal-rank fusion, ``[B, N]``
    float32: ``1 / (k + rank)`` for each tool of ``following(t)`` (ids ``[m]``; None or empty: no ranking),
    ``t`` the step's last call the registry knows, ranked by ``vec [B, N]`` (ties by registry position; a
    tool with no finite vector score, removed or not retrieved, is not ranked); 0 for every other tool and for
    a step with no such call."""
    out = np.zeros(vec.shape, dtype=np.float32)
    positions = registry.positions
    for row, v, step in zip(out, vec, steps):
        last = last_known_call(step, positions)
        ids = following(last) if last is not None else None
        if ids is None or len(ids) == 0:
            continue
        ids = ids[np.isfinite(v[ids])]
        ranked = ids[np.lexsort((ids, -v[ids]))]
        row[ranked] = 1.0 / (k + np.arange(1, len(ranked) + 1, dtype=np.float64))
    return out


def toolkit_rrf(steps: Sequence[Step], vec: np.ndarray, registry, kits: Mapping[str, np.ndarray],
                k: int) -> np.ndarray:
    """:func:`last_call_rrf` of the tools of the last call's toolkit (``kits``: :func:`toolkits`)."""
    return last_call_rrf(steps, vec, registry, lambda t: kits.get(registry[t].source), k)


def dataflow_rrf(steps: Sequence[Step], vec: np.ndarray, registry, flow: Dataflow, k: int) -> np.ndarray:
    """:func:`last_call_rrf` of the tools taking what the last call looked up (``flow.consumers``)."""
    return last_call_rrf(steps, vec, registry, flow.consumers.__getitem__, k)


def second_place(scores: np.ndarray, steps: Sequence[Step], vec: np.ndarray, registry) -> np.ndarray:
    """``scores [B, N]`` float32, the turn's previous call (the last of ``Step.prefix``) moved up to second
    place where it ranks lower: its score becomes the next float32 above the second best of the others (ties
    by registry position), so the first place stays the fusion's. A step that opens its turn, or whose last
    call the registry does not know or has no finite vector score in ``vec [B, N]`` (removed, not retrieved),
    is unchanged."""
    out = np.array(scores, dtype=np.float32)
    positions = registry.positions
    last = [positions.get(s.prefix[-1], -1) if s.prefix else -1 for s in steps]
    rows = np.flatnonzero([t >= 0 and np.isfinite(v[t]) for t, v in zip(last, vec)])      # [R]
    if len(rows) == 0 or out.shape[1] < 3:
        return out
    ids = np.asarray(last)[rows]                                                           # [R]
    others = out[rows]                                                                     # [R, N] copy
    others[np.arange(len(rows)), ids] = -np.inf
    first, second = (-np.partition(-others, 1, axis=1)[:, :2]).T                           # [R] each
    move = out[rows, ids] < second
    out[rows[move], ids[move]] = np.nextafter(second[move], first[move])
    return out


class ZeroShot(Guard):
    """The zero-shot ranking and the guard (module docstring).

    Args:
        kind: ``vector`` or ``hybrid``.
        guard: pick between the model and this ranking at fit time (False: always the model, once fitted).
        k: the recall@k the guard compares.
        bm25: ``{k1, b}`` of the lexical input (``hybrid``).
        rrf_k: the fusion's rank offset (``hybrid``).
        novel: j, the zero-shot top j from which never-called tools take the last slots (0: off).
        novel_toolkit: J, the wider top from which a never-called tool of the toolkit of the conversation's
            last call claims (``novel`` on; at most ``novel``: no wider top).
        slots: how many of the k presented slots never-called tools may take (``novel`` on).
        novel_from: the ranking whose top j the never-called tools come from: ``zero_shot``, ``vector``,
            ``bm25`` (the tools whose words the request shares) or ``hybrid`` (vector and BM25 fused).
        toolkit: fuse the ranking of the last call's toolkit too (module docstring; with ``vector``, the
            fusion of the vector ranking and this one).
        calls: move the turn's previous call up to second place.
        dataflow: fuse the ranking of the tools taking what the last call looked up.
        candidates: this ranking's top m join the model's candidates, its score, rank and top-m flag its
            features (module docstring).
        usage: the prior of the usage vectors that stand for the called tools in the vector input
            (module docstring, :mod:`tracer.scorer_base.usage`); None: the description vectors alone.
        gate: where the model serves on a gateway's own logs (they hold trials), the steps whose state those
            logs do not know (the first key's state has no children) are ranked by this ranking instead
            (module docstring).
        trial: the share of conversations on which a gateway presents the other ranking's top k too
            (:mod:`tracer.scorer_base.trial`); once the logs hold enough of their steps, the guard compares
            the model with this ranking on those steps alone (0: never).
    """

    def __init__(self, kind: str = "vector", guard: bool = False, k: int = 5, bm25: Mapping | None = None,
                 rrf_k: int = 60, novel: int = 0, slots: int = 1, toolkit: bool = False,
                 calls: bool = False, dataflow: bool = False, candidates: bool = False,
                 usage: float | None = None, novel_from: str = "zero_shot", trial: float = 0.0,
                 gate: bool = False, novel_toolkit: int = 0):
        if kind not in KINDS:
            raise ValueError(f"zero_shot.kind: {kind!r}; valid: {', '.join(KINDS)}")
        for flag, value in (("toolkit", toolkit), ("calls", calls), ("dataflow", dataflow),
                            ("candidates", candidates), ("gate", gate)):
            if not isinstance(value, bool):
                raise TypeError(f"zero_shot.{flag} must be a bool, got {value!r}")
        if isinstance(novel, bool) or not isinstance(novel, int) or novel < 0:
            raise ValueError(f"zero_shot.novel must be an int >= 0, got {novel!r}")
        if isinstance(novel_toolkit, bool) or not isinstance(novel_toolkit, int) or novel_toolkit < 0:
            raise ValueError(f"zero_shot.novel_toolkit must be an int >= 0, got {novel_toolkit!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"zero_shot.slots must be an int >= 1, got {slots!r}")
        if novel_from not in NOVEL_FROM:
            raise ValueError(f"zero_shot.novel_from: {novel_from!r}; valid: {', '.join(NOVEL_FROM)}")
        self.novel_from, self.novel_toolkit = novel_from, novel_toolkit
        self.trial = check_rate(trial, "zero_shot.trial")
        self.gate = gate
        self.kind, self.guard, self.k, self.rrf_k, self.novel = kind, bool(guard), int(k), int(rrf_k), novel
        self.bm25_cfg = dict(bm25 or {"k1": 1.5, "b": 0.75})
        self.toolkit, self.calls, self.slots, self.dataflow = toolkit, calls, slots, dataflow
        self.candidates = candidates
        self.usage = None if usage is None else check_prior(usage, "zero_shot.usage")
        self._lexical = None  # (registry, BM25Scorer), built on first use
        self._kits = None  # (registry, toolkits(registry)), built on first use
        self._flow = None  # (registry, Dataflow(registry)), built on first use

    @classmethod
    def from_config(cls, cfg: Mapping | None) -> ZeroShot:
        return cls(**dict(cfg or {}))

    def config(self) -> dict:
        return {"kind": self.kind, "guard": self.guard, "k": self.k, "bm25": dict(self.bm25_cfg),
                "rrf_k": self.rrf_k, "novel": self.novel, "slots": self.slots, "toolkit": self.toolkit,
                "calls": self.calls, "dataflow": self.dataflow, "candidates": self.candidates,
                "usage": self.usage, "novel_from": self.novel_from, "novel_toolkit": self.novel_toolkit,
                "trial": self.trial, "gate": self.gate}

    def _bm25(self, res, rendering):
        if self._lexical is None or self._lexical[0] is not res.registry:
            context = {f: getattr(rendering, f) for f in rendering.__dataclass_fields__}
            scorer = BM25Scorer(name="bm25", context=context, **self.bm25_cfg)
            scorer.fit([], res)
            self._lexical = (res.registry, scorer)
        return self._lexical[1]

    def toolkits(self, registry) -> dict[str, np.ndarray]:
        """:func:`toolkits` of ``registry``, built once per registry."""
        if self._kits is None or self._kits[0] is not registry:
            self._kits = (registry, toolkits(registry))
        return self._kits[1]

    @property
    def fuses(self) -> bool:
        """Whether the zero-shot scores are a fusion (else the vector scores themselves)."""
        return self.kind != "vector" or self.toolkit or self.calls or self.dataflow

    def scores(self, steps: Sequence[Step], vec: np.ndarray, res, rendering) -> np.ndarray:
        """``[B, N]`` float32 zero-shot scores of the steps (higher first, ties by registry position), from
        their vector scores ``vec [B, N]``."""
        if not self.fuses:
            return np.asarray(vec, dtype=np.float32)
        vec = np.asarray(vec)
        lexical = self._bm25(res, rendering).step_scores(steps) if self.kind == "hybrid" else None  # [B, N]
        if res.tool_index.exact:
            fused = rrf(vec, k=self.rrf_k) if lexical is None else rrf(vec, lexical, k=self.rrf_k)
        else:  # an approximate index: fuse what it retrieved with as many lexical leaders, no registry sort
            fused = rrf_retrieved(vec, lexical, self.rrf_k, res.tool_index.ann_k)
        if self.toolkit:
            fused = fused + toolkit_rrf(steps, vec, res.registry, self.toolkits(res.registry), self.rrf_k)
        if self.dataflow:
            if self._flow is None or self._flow[0] is not res.registry:
                self._flow = (res.registry, Dataflow(res.registry))
            fused = fused + dataflow_rrf(steps, vec, res.registry, self._flow[1], self.rrf_k)
        return second_place(fused, steps, vec, res.registry) if self.calls else fused

    @property
    def novel_needs_fusion(self) -> bool:
        """Whether the novel slots read this fusion (else what :meth:`novel_scores` builds from the vector and
        BM25 scores, or nothing when off)."""
        return bool(self.novel) and self.novel_from == "zero_shot"

    def novel_scores(self, steps: Sequence[Step], vec: np.ndarray, zs: np.ndarray | None, res,
                     rendering, lexical: np.ndarray | None = None) -> np.ndarray:
        """``[B, N]``: the ranking the novel slots read (``novel_from``), from the steps' vector scores
        ``vec [B, N]``, this fusion's ``zs [B, N]`` (None unless ``novel_needs_fusion``) and BM25 scores
        ``lexical [B, N]``: the request's, which tracer_plus's request evidence has computed already (None,
        with the request evidence off: BM25 of ``rendering`` here, a second pass over the registry). BM25
        ranks only the tools that share a word with the request (the rest ``-inf``): a tie at 0 is no
        evidence."""
        if self.novel_from == "zero_shot":
            return zs
        if self.novel_from == "vector":
            return vec
        if lexical is None:
            lexical = self._bm25(res, rendering).step_scores(steps)                          # [B, N]
        if self.novel_from == "bm25":
            return np.where(lexical > 0, lexical, -np.inf).astype(np.float32)
        if res.tool_index.exact:
            return rrf(vec, lexical, k=self.rrf_k)
        return rrf_retrieved(np.asarray(vec), lexical, self.rrf_k, res.tool_index.ann_k)

    def reserve(self, zs: np.ndarray, never_called: np.ndarray, steps: Sequence[Step] | None = None,
                registry=None) -> list[tuple[int, ...]]:
        """Per step, the never-called tools (``never_called [N]`` bool) among the top ``novel`` of its scores
        ``zs [B, N]`` (:meth:`novel_scores`, the ranking ``novel_from`` names; ties by registry position),
        and with ``novel_toolkit`` those of the toolkit of the step's last call (``steps``, ``registry``)
        among its top ``novel_toolkit``: that toolkit's first, then the others, each best first. A tool the
        ranking left unscored (``-inf``: not retrieved, no word shared) claims nothing."""
        j = self.novel
        knows_calls = steps is not None and registry is not None
        wide = self.novel_toolkit if knows_calls and self.novel_toolkit > j else j
        out = []
        for b, row in enumerate(zs):
            kit = self._last_toolkit(steps[b], registry) if wide > j else None
            claims = [(kit is not None and registry[t].source == kit, rank, t)
                      for rank, t in enumerate(top_ids(row, wide).tolist())
                      if never_called[t] and row[t] > -np.inf]
            # the toolkit in use's claimants first, then the top j's others, each kind best first
            out.append(tuple(t for ours, rank, t in sorted(claims, key=lambda c: (not c[0], c[1]))
                             if ours or rank < j))
        return out

    def _last_toolkit(self, step: Step, registry) -> str | None:
        """The toolkit (``Tool.source``) of the step's last call the registry knows, where it is one of
        :meth:`toolkits` (named, not the whole registry); else None."""
        last = last_known_call(step, registry.positions)
        kit = None if last is None else registry[last].source
        return kit if kit in self.toolkits(registry) else None
