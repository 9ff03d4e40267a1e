"""One live step's candidates in numpy: :func:`tracer.scorers.tracer_plus.features.candidates` for a batch of
one, row for row and bit for bit (tracer_plus's single-step path; tests/unit/scorers/test_tracer_plus.py holds
them equal).

It lives beside the batched builder rather than in :mod:`tracer.scoring.single_step` because it reads
tracer_plus's feature layout, which belongs to the learn layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tracer.core.types import Step
from tracer.scorers.tracer_plus.features import FUSION_FEATURES, KEY_FEATURES, Candidates, n_features
from tracer.scorers.tracer_plus.index import PlusIndex
from tracer.scorers.tracer_plus.request import RequestInput
from tracer.scoring.single_step import children_one


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
    """:func:`candidates` for one step in numpy (the single-step path); the same rows bit for bit.

    With ``order`` (the tools an approximate index retrieved, best first; ``vec`` is ``-inf`` for the
    others) nothing scans the registry: a retrieved tool's rank is its position there, one not retrieved
    (a trie child) gets rank T + 1 and the lowest retrieved cosine as its ``vec_cos`` (as far as the index
    knows, it scores at most that), the tool-memory cosine is taken for the candidates alone. This is the
    definition for approximate indexes; the batched path is this function row by row
    (:func:`candidates_rows`). ``zs [N]``: the zero-shot fusion (``zero_shot.candidates``), whose top m join
    the candidates and give the fusion's three features. ``req``: the step's request evidence (one row), whose
    top BM25 matches join the candidates and whose features close each row.
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
        feats[:, base + 4] = lv
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


def candidates_rows(idx: PlusIndex, steps: list[Step], mem_ctx: torch.Tensor, vec: torch.Tensor, m: int,
                    zs: torch.Tensor | None = None, req: RequestInput | None = None) -> Candidates:
    """:func:`candidates` for an approximate index: :func:`candidates_one` row by row (``vec [B, N]`` with
    ``-inf`` for the tools not retrieved), stacked and padded; the live path's numbers by construction."""
    mem = mem_ctx.detach().cpu().numpy()                                                 # [B, d]
    v = vec.detach().cpu().numpy()                                                       # [B, N]
    z = None if zs is None else zs.detach().cpu().numpy()                                # [B, N]
    ones = [candidates_one(idx, s, mem[i], v[i], m, retrieved_order(v[i]), None if z is None else z[i],
                           None if req is None else req.take([i]))
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
