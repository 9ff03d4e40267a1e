"""Candidates and features of ``tracer_plus``: the union of several keys' children and the vector top m.

At a step, every configured state key (:class:`tracer.memory.trie.StateKey`) maps the calls so far to a
state ``S_j`` in its own execution trie, and the vector index ranks the registry by the cosine of
the query context with each tool. The candidate set is

    cand = (children of S_1) ∪ ... ∪ (children of S_K) ∪ (top m of the vector ranking)

sorted by registry id. Every candidate ``t`` gets one feature row (``F`` numbers): per key ``j``
(named ``<key label>.<feature>``, e.g. ``prefix.log_p``, ``last_1+cross_turn.member``):

============== ============================================================= ===========================
feature        meaning                                                       outside S_j's children
============== ============================================================= ===========================
member         1 if t is a child of S_j                                      0
log_p          empirical prior log(N(S_j,t)/N(S_j) + eps)                    0
log_r          contextual prior log(relu(cos)/sum relu(cos) + eps) over      0
               S_j's children (the trie's ``log_l``)
edge_cos       raw cosine of the memory context with the edge memory         0
               m_{S_j,t}
log_visits     log(1 + N(S_j)) (state level; 0 for an unseen state)          the state's value
log_children   log(1 + number of children of S_j) (state level)              the state's value
member*v       member x log_visits, member x log_children                     0
log_p*v ...    log_p, log_r and edge_cos each x log_visits and x log_children 0
============== ============================================================= ===========================

The neutral values of a candidate outside ``S_j``'s children (``NEUTRAL``) are all 0, so every
product is 0 too; ``member`` = 0 tells the model that the zeros mean "not proposed by this key"
(for a linear scorer the constant chosen does not matter: the weight of ``member`` absorbs it).
State-level features are equal for every candidate of a step, so alone they cannot reorder the
candidates under a softmax; they act through their products (how far to trust this key's
proposal and priors at a well-visited or a wide state) and through the MLP.

Global features, defined for every candidate:

- ``vector`` group: ``vec_cos`` (cosine of the query context with the tool's name and
  description), ``vec_rank`` (log of the 1-based rank in the vector ranking of the whole
  registry, ties by registry position) and ``vec_top`` (1 if that rank is at most m, i.e. the
  vector search proposed it).
- ``tool`` group: ``tool_log_freq`` = log(1 + number of training steps that called t) and
  ``tool_cos`` = cosine of the memory context with the tool memory (the normalised mean context
  of every training step that called t, whatever its state: the edge memory of an empty state;
  0 for a tool never called).
- ``history`` group: ``hist_count`` = log(1 + times t was called earlier in the conversation),
  ``in_turn`` = 1 if t was called earlier in this turn, ``is_last`` = 1 if t is the previous call.

With ``zero_shot.candidates`` (:mod:`tracer.scorers.tracer_plus.zero_shot`) the zero-shot fusion's top m
join the candidates too, and a ``fusion`` group closes each row: ``zs_score`` (the fused score), ``zs_rank``
(log of the 1-based rank in the fusion) and ``zs_top`` (1 if that rank is at most m).

With ``request`` (:mod:`tracer.scorers.tracer_plus.request`) the request's best BM25 matches join the
candidates too, and a ``request`` group closes each row: ``req_bm25``, ``req_top``, ``req_name`` and
``never_called`` (what the request asks, from its own words, and whether the logs hold any evidence).

Feature groups (for ``features.drop``): ``member``, ``log_p``, ``log_r``, ``edge_cos``,
``state`` (log_visits, log_children and every product with them), ``vector``, ``tool``, ``history``,
``fusion`` and ``request``; a product belongs to both factors' groups and goes when either is dropped.

One definition for a batch and a live step: :func:`candidates_one` builds one step's candidates and rows
(numpy, CPU), and :func:`candidates` is it row by row, stacked and padded, so the gateway's single step
(:mod:`tracer.scorers.tracer_plus.step`), the batched scores and the training rows of :mod:`.inner_folds`
read the same numbers by construction. Priors and edge cosines come from
:func:`tracer.scorer_base.single_step.children_one` (bit for bit :meth:`ExecutionTrie.gather`), the state
features and log ranks from float32 tables built once, products are float32 x float32, and the tool cosines
are float64 matrix-vector products rounded to float32, as the trie's similarities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tracer.core.types import Step
from tracer.learn import standardise
from tracer.memory.keys import StateKey
from tracer.scorer_base.single_step import children_one
from tracer.scorers.tracer_plus.index import PlusIndex
from tracer.scorers.tracer_plus.request import REQUEST_FEATURES, SEMANTIC_FEATURES, RequestInput

KEY_FEATURES = ("member", "log_p", "log_r", "edge_cos", "log_visits", "log_children",
                "member*log_visits", "member*log_children", "log_p*log_visits", "log_p*log_children",
                "log_r*log_visits", "log_r*log_children", "edge_cos*log_visits", "edge_cos*log_children")
VECTOR_FEATURES = ("vec_cos", "vec_rank", "vec_top")
TOOL_FEATURES = ("tool_log_freq", "tool_cos")
HISTORY_FEATURES = ("hist_count", "in_turn", "is_last")
GLOBAL_FEATURES = VECTOR_FEATURES + TOOL_FEATURES + HISTORY_FEATURES
# the zero-shot fusion's score, log rank and top-m flag (zero_shot.candidates: after the global features)
FUSION_FEATURES = ("zs_score", "zs_rank", "zs_top")
GROUPS = ("member", "log_p", "log_r", "edge_cos", "state", "vector", "tool", "history", "fusion", "request")
NEUTRAL = {"member": 0.0, "log_p": 0.0, "log_r": 0.0, "edge_cos": 0.0}
_STATE = ("log_visits", "log_children")


def feature_names(keys: Sequence[StateKey], fusion: bool = False,
                  request: Sequence[str] = ()) -> tuple[str, ...]:
    """Every column's name: the keys', the global ones, the fusion's, then ``request``'s (the request
    evidence's columns, :attr:`tracer.scorers.tracer_plus.request.RequestEvidence.features`)."""
    return (tuple(f"{k.label}.{f}" for k in keys for f in KEY_FEATURES) + GLOBAL_FEATURES
            + (FUSION_FEATURES if fusion else ()) + tuple(request))


def feature_groups(name: str) -> set[str]:
    """The groups a feature belongs to (``features.drop`` removes a feature when any of them is dropped)."""
    base = name.rsplit(".", 1)[-1]
    for group, names in (("vector", VECTOR_FEATURES), ("tool", TOOL_FEATURES), ("history", HISTORY_FEATURES),
                         ("fusion", FUSION_FEATURES), ("request", REQUEST_FEATURES + SEMANTIC_FEATURES)):
        if base in names:
            return {group}
    return {"state" if part in _STATE else part for part in base.split("*")}


def keep_mask(names: Sequence[str], drop: Sequence[str]) -> torch.Tensor:
    """``[F]`` 1 for a feature in use, 0 for one dropped by group (``GROUPS``) or by its full name."""
    return standardise.keep_mask(names, drop, GROUPS, feature_groups)


def n_features(n_keys: int, fusion: bool = False, n_request: int = 0) -> int:
    """F: the width of a feature row with ``n_keys`` keys (and the fusion's and ``n_request`` request
    features)."""
    fused = len(FUSION_FEATURES) if fusion else 0
    return n_keys * len(KEY_FEATURES) + len(GLOBAL_FEATURES) + fused + n_request


@dataclass
class Candidates:
    """Candidate sets of B steps, padded to the widest one (C)."""

    tool: torch.Tensor      # [B, C] registry ids, ascending (0 where masked)
    mask: torch.Tensor      # [B, C] True for a real candidate
    feats: torch.Tensor     # [B, C, F] raw features (float32; 0 where masked)
    in_state: torch.Tensor  # [B, K] key j's state has children
    depth: torch.Tensor     # [B] length of the first key's state (-1 when unseen)

    def gold_index(self, gold_ids: torch.Tensor, ignore: int = -100) -> torch.Tensor:
        """Position of each step's gold id ``[B]`` among its candidates, ``ignore`` where it is not one."""
        gold_ids = gold_ids.to(self.tool.device)
        hit = self.mask & (self.tool == gold_ids[:, None])                               # [B, C]
        return torch.where(hit.any(1), hit.float().argmax(1), torch.full_like(gold_ids, ignore))


def coverage(registry, steps: Sequence[Step], tool: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` 1.0 if the step's gold is a candidate, 0.0 if not, -1.0 if unknown."""
    gold = torch.tensor([registry.id(s.gold) if s.gold in registry else -1 for s in steps], dtype=torch.long)
    hit = (mask.cpu() & (tool.cpu() == gold[:, None])).any(1).float()
    return torch.where(gold >= 0, hit, -1.0)




@dataclass
class OneCandidates:
    """:class:`Candidates` of one step (numpy), plus the vector order for padding."""

    tool: np.ndarray        # [C] int64 registry ids, ascending
    feats: np.ndarray       # [C, F] float32 raw features
    in_state: np.ndarray    # [K] bool
    depth: int              # length of the first key's state (-1 when unseen)
    order: np.ndarray       # [N] registry ids by vector score, best first (ties by registry position);
                            # [T] the tools an approximate index retrieved
    reserve: tuple[int, ...] = ()  # never-called tools claiming the k-th slot (zero_shot.novel)


def retrieved_order(vec: np.ndarray) -> np.ndarray:
    """The tools with a finite vector score, best first, ties by registry position: an approximate index's
    answer (:meth:`tracer.encode.index.ToolIndex.top_one`) read back from its scores ``[N]``."""
    ids = np.flatnonzero(np.isfinite(vec))
    return ids[np.lexsort((ids, -vec[ids]))]


def _fusion_rank(zs: np.ndarray, approx: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(rank [N] int64, score [N] float32)`` of the zero-shot fusion ``zs [N]``: ranks of a stable
    descending sort; over an approximate index the fused tools in order, every other one rank T + 1 with the
    lowest fused score (as a candidate the index did not retrieve gets for the vector features)."""
    rank = np.empty(len(zs), dtype=np.int64)
    if not approx:
        rank[np.argsort(-zs, kind="stable")] = np.arange(1, len(zs) + 1)
        return rank, zs
    fused = retrieved_order(zs)
    rank[:] = len(fused) + 1
    rank[fused] = np.arange(1, len(fused) + 1)
    return rank, np.where(np.isfinite(zs), zs, zs[fused[-1]] if len(fused) else np.float32(0))


def candidates_one(idx: PlusIndex, step: Step, mem_ctx: np.ndarray, vec: np.ndarray, m: int,
                   order: np.ndarray | None = None, zs: np.ndarray | None = None,
                   req: RequestInput | None = None) -> OneCandidates:
    """One step's candidates and raw feature rows (see the module docstring), numpy on the CPU: the one
    definition, which :func:`candidates` stacks for a batch and the live step calls once.

    ``mem_ctx [d]``: the step's context under the memory rendering; ``vec [N]`` float32: the registry's vector
    scores under the query rendering. With ``order`` (the tools an approximate index retrieved, best first;
    ``vec`` is ``-inf`` for the others) nothing scans the registry: a retrieved tool's rank is its position
    there, one not retrieved (a trie child) gets rank T + 1 and the lowest retrieved cosine as its ``vec_cos``
    (as far as the index knows, it scores at most that), the tool-memory cosine is taken for the candidates
    alone. ``zs [N]``: the zero-shot fusion (``zero_shot.candidates``), whose top m join the candidates and
    give the fusion's three features. ``req``: the step's request evidence (one row), whose top BM25 matches
    join the candidates and whose features close each row.
    """
    tries, tables = idx.tries, idx.tables
    n = len(vec)
    states = [t.key.state(step) for t in tries]
    kids = [children_one(t, s, mem_ctx) for t, s in zip(tries, states)]
    approx = order is not None
    rank = np.empty(n, dtype=np.int64)
    if approx:
        rank[order] = np.arange(1, len(order) + 1)
    else:
        order = np.argsort(-vec, kind="stable")                                          # [N]
        rank[order] = np.arange(1, n + 1)
    is_cand = np.zeros(n, dtype=bool)
    for ch in kids:
        is_cand[ch.tool] = True
    is_cand[order[:max(m, 0)]] = True
    if zs is not None:
        z_rank, z_score = _fusion_rank(zs, approx)
        is_cand[z_rank <= m] = True
    if req is not None:
        is_cand |= req.top[0]
    tool = np.flatnonzero(is_cand)                                                       # [C] ascending
    col_of = np.empty(n, dtype=np.int64)
    col_of[tool] = np.arange(len(tool))
    n_key = len(KEY_FEATURES)
    n_request = len(req.features) if req is not None else 0
    feats = np.zeros((len(tool), n_features(len(tries), zs is not None, n_request)), dtype=np.float32)
    for j, (ch, tab) in enumerate(zip(kids, tables)):
        base = j * n_key
        lv = tab.log_visits_np[ch.node] if ch.node >= 0 else np.float32(0)
        lc = tab.log_children_np[ch.node] if ch.node >= 0 else np.float32(0)
        feats[:, base + 4] = lv                                                          # non-members too
        feats[:, base + 5] = lc
        if len(ch.tool):
            block = np.empty((len(ch.tool), n_key), dtype=np.float32)                   # [Ck, 14]
            block[:, 0] = 1.0
            block[:, 1], block[:, 2], block[:, 3] = ch.log_p, ch.log_l, ch.sim
            block[:, 4], block[:, 5] = lv, lc
            block[:, 6::2] = block[:, :4] * lv
            block[:, 7::2] = block[:, :4] * lc
            feats[col_of[ch.tool], base:base + n_key] = block
    g = len(tries) * n_key
    ctx64 = np.asarray(mem_ctx, dtype=np.float64)
    if approx:
        cos = vec[tool]
        far = ~np.isfinite(cos)
        r = np.full(len(tool), len(order) + 1, dtype=np.int64)                          # not retrieved: T + 1
        r[~far] = rank[tool[~far]]
        feats[:, g] = np.where(far, vec[order[-1]] if len(order) else np.float32(0), cos)
        feats[:, g + 4] = (idx.tool_memory64[tool] @ ctx64).astype(np.float32)
    else:
        r = rank[tool]
        feats[:, g] = vec[tool]
        feats[:, g + 4] = (idx.tool_memory64 @ ctx64).astype(np.float32)[tool]
    feats[:, g + 1] = idx.log_ranks[r - 1]
    feats[:, g + 2] = r <= m
    feats[:, g + 3] = idx.tool_log_freq_np[tool]
    if step.history:
        get = idx.tool_id.get
        hist = [i for i in map(get, step.history) if i is not None]
        if hist:
            calls = np.zeros(n, dtype=np.int64)
            np.add.at(calls, hist, 1)
            feats[:, g + 5] = np.log1p(calls[tool].astype(np.float64))
            turn = np.zeros(n, dtype=np.float32)
            turn[[i for i in map(get, step.prefix) if i is not None]] = 1
            feats[:, g + 6] = turn[tool]
            last = get(step.history[-1])
            if last is not None and is_cand[last]:
                feats[col_of[last], g + 7] = 1
    if zs is not None:
        feats[:, g + 8] = z_score[tool]
        feats[:, g + 9] = idx.log_ranks[z_rank[tool] - 1]
        feats[:, g + 10] = z_rank[tool] <= m
    if req is not None:
        r0 = g + 8 + (len(FUSION_FEATURES) if zs is not None else 0)
        feats[:, r0:] = req.rows(0, tool, idx.tool_log_freq_np == 0)
    depth = len(states[0]) if kids and kids[0].node >= 0 else -1
    return OneCandidates(tool, feats, np.array([len(ch.tool) > 0 for ch in kids], dtype=bool), depth, order)


def candidates(idx: PlusIndex, steps: Sequence[Step], mem_ctx: torch.Tensor, vec: torch.Tensor,
               m: int, zs: torch.Tensor | None = None, req: RequestInput | None = None,
               approximate: bool = False) -> Candidates:
    """Candidates and raw features of a batch: :func:`candidates_one` row by row, stacked and padded to the
    widest row, on the tries' device.

    Args:
        idx: the tries (one per key; the trie's ``key`` maps a step to its state) and tables.
        steps: B steps.
        mem_ctx: ``[B, d]`` contexts under the memory rendering (edge and tool cosines).
        vec: ``[B, N]`` float32 vector scores of the registry under the query rendering.
        m: how many of the vector ranking's top tools join the candidates.
        zs: ``[B, N]`` the zero-shot fusion's scores (``zero_shot.candidates``): its top m join the candidates
            too, and its score, log rank and top-m flag are three more features; None: neither.
        req: the steps' request evidence (``request``): its top BM25 matches join the candidates and its
            features close each row (:meth:`RequestInput.rows`); None: neither.
        approximate: ``vec`` comes from an approximate tool index (``-inf`` for the tools it did not
            retrieve): a step's candidates and ranks are read from what it retrieved.
    """
    mem = mem_ctx.detach().cpu().numpy()                                                 # [B, d]
    v = vec.detach().cpu().numpy()                                                       # [B, N]
    z = None if zs is None else zs.detach().cpu().numpy()                                # [B, N]
    ones = [candidates_one(idx, s, mem[i], v[i], m, retrieved_order(v[i]) if approximate else None,
                           None if z is None else z[i], None if req is None else req.take([i]))
            for i, s in enumerate(steps)]
    width = max([len(o.tool) for o in ones] + [1])
    n_request = len(req.features) if req is not None else 0
    b, f = len(ones), n_features(len(idx.tries), zs is not None, n_request)
    tool = np.zeros((b, width), dtype=np.int64)
    mask = np.zeros((b, width), dtype=bool)
    feats = np.zeros((b, width, f), dtype=np.float32)
    for i, o in enumerate(ones):
        c = len(o.tool)
        tool[i, :c], mask[i, :c], feats[i, :c] = o.tool, True, o.feats
    in_state = np.array([o.in_state for o in ones], dtype=bool).reshape(b, len(idx.tries))
    device = idx.tries[0].device if idx.tries else vec.device
    return Candidates(tool=torch.from_numpy(tool).to(device), mask=torch.from_numpy(mask).to(device),
                      feats=torch.from_numpy(feats).to(device),
                      in_state=torch.from_numpy(in_state).to(device),
                      depth=torch.tensor([o.depth for o in ones], dtype=torch.long, device=device))
