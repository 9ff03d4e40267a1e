"""The single-step path: one live step scored with numpy on the CPU, equal to the batched path.

Why it exists: the batched torch path called with a batch of one costs about 1 ms beyond the
context embedding on BFCL (small tensor ops and Python around them), against a per-step budget well
under 1 ms (the gateway adds <= 2 ms per request, the static-encoder preset <= 2 ms end to end);
this path costs 0.1-0.2 ms (``benchmarks/bench_step.py``, docs/performance.md). It is the only copy of
the batched arithmetic, and every function here names the batched function it equals, bit for bit:

- :func:`children_one` = :meth:`tracer.memory.trie.ExecutionTrie.gather` for one state,
- :func:`contextual_prior_one` = :func:`tracer.memory.priors.contextual_prior`,
- :func:`dense_scores_one` / :func:`top_scores_one` = :meth:`tracer.encode.index.ToolIndex.dense_scores`,
- :func:`confidence_one` = :func:`tracer.scorer_base.ranking.confidence`,
- :func:`rank_one` / :func:`finalize_one` = :func:`tracer.scorer_base.ranking.rank` / ``finalize``.

Arithmetic: cosines are accumulated in float64 from float32 vectors and rounded to float32 in both
paths, which makes them independent of the kernel's summation order (see :mod:`tracer.memory.trie`).
Scorers expose it through one declared signature, ``select_one(step, contexts, k, pad)`` /
``rank_one(step, contexts, top)`` (:class:`tracer.scorer_base.protocol.Scorer`);
``tests/integration/scorers/test_scorer_conformance.py`` checks every scorer's against its batched ranking
on BFCL.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tracer.encode.index import ToolIndex
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.ranking import _desc_keys, present

_MEM64_MAX = 1 << 22  # keep a float64 host copy of the edge memory up to this many numbers (32 MiB)
_WIDE, _WIDE64_BUDGET = 256, 256 << 20  # larger tries: float64 copies of nodes with >= 256 children, 256 MiB
_INDEX_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ToolIndex -> float64 matrix, max norm


def as_numpy(x) -> np.ndarray:
    """A context vector (tensor on any device, array or list) as a flat numpy array, without a copy on the
    CPU."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return (x if x.device.type == "cpu" else x.cpu()).numpy().reshape(-1)
    return np.asarray(x).reshape(-1)


# ---- the trie --------------------------------------------------------------------------------------
@dataclass
class OneStep:
    """The children of one state, for the single-step path (numpy, CPU). C = children of the node."""

    node: int               # node id, -1 for an unseen state
    tool: np.ndarray        # [C] int64 registry ids
    count: np.ndarray       # [C] int64 N(S, t)
    log_p: np.ndarray       # [C] float32
    sim: np.ndarray         # [C] float32
    log_l: np.ndarray       # [C] float32


@dataclass
class _Host:
    """CPU (numpy) views of the trie for the single-step path."""

    indptr: list[int]
    tool: np.ndarray        # [E] int64
    count: np.ndarray       # [E] int64
    log_p: np.ndarray       # [E] float32
    mem: np.ndarray         # [E, d] float32
    mem64: np.ndarray | None  # [E, d] float64 copy for small tries (saves a conversion per step)
    wide64: dict[int, np.ndarray]  # float64 copies of the children of wide nodes (large tries)
    wide_budget: int        # bytes still allowed for wide64


def host(trie: ExecutionTrie) -> _Host:
    """CPU numpy views of a trie used by :func:`children_one` (built once per trie, dropped by its update)."""
    if trie.single_step_cache is None:
        mem = trie.edge_memory.detach().cpu()
        mem_np = mem.numpy() if mem.dtype != torch.bfloat16 else mem.float().numpy()
        trie.single_step_cache = _Host(
            indptr=trie.indptr.tolist(), tool=trie.edge_tool.cpu().numpy(),
            count=trie.edge_count.cpu().numpy(),
            log_p=trie.edge_log_p.cpu().numpy(), mem=mem_np,
            mem64=mem_np.astype(np.float64) if mem_np.size <= _MEM64_MAX else None, wide64={},
            wide_budget=_WIDE64_BUDGET)
    return trie.single_step_cache

def rows_rewritten(trie: ExecutionTrie, nodes: np.ndarray, edges: np.ndarray) -> None:
    """Keep a trie's single-step cache valid after ``edges`` (rows of ``nodes``) were rewritten in place, the
    layout unchanged (:func:`tracer.online.incremental.add_steps`): its numpy views see the new values
    already; the float64 copies of those rows are redone, so the next live step does not rebuild the whole
    cache."""
    h = trie.single_step_cache
    if h is None:
        return
    if h.mem64 is not None:
        h.mem64[edges] = h.mem[edges]
    for u in nodes.tolist():  # a wide node's copy is made again when next read
        h.wide_budget += h.wide64.pop(u, np.zeros(0)).nbytes


def children_one(trie: ExecutionTrie, state: tuple[str, ...], context: np.ndarray | None) -> OneStep:
    """The children of one state scored against one context ``[d]`` (float64 or float32): numpy, CPU.

    Same arithmetic as :meth:`ExecutionTrie.gather`, bit for bit.
    """
    h = host(trie)
    u = trie.nodes.get(state, -1)
    if u < 0:
        empty_f = np.zeros(0, np.float32)
        return OneStep(-1, np.zeros(0, np.int64), np.zeros(0, np.int64), empty_f, empty_f, empty_f)
    lo, hi = h.indptr[u], h.indptr[u + 1]
    if context is None:
        sim = np.zeros(hi - lo, np.float32)
    else:
        if h.mem64 is not None:
            mem = h.mem64[lo:hi]
        elif u in h.wide64:
            mem = h.wide64[u]
        else:
            mem = h.mem[lo:hi].astype(np.float64)
            if hi - lo >= _WIDE and mem.nbytes <= h.wide_budget:  # keep the conversion of a wide node
                h.wide64[u] = mem
                h.wide_budget -= mem.nbytes
        sim = (mem @ np.asarray(context, dtype=np.float64)).astype(np.float32)  # [C]
    return OneStep(u, h.tool[lo:hi], h.count[lo:hi], h.log_p[lo:hi], sim, contextual_prior_one(sim, trie.eps))


def contextual_prior_one(sim: np.ndarray, eps: float) -> np.ndarray:
    """:func:`tracer.memory.priors.contextual_prior` for the children of one state, ``[C]`` float32 -> ``[C]``
    float32 (numpy)."""
    n = len(sim)
    if n == 0:
        return np.zeros(0, np.float32)
    pos = np.maximum(sim, 0.0, dtype=np.float64)                          # [C] float64
    total = pos.sum()
    if total > 0:
        np.divide(pos, total, out=pos)
    else:
        pos.fill(1.0 / n)
    np.add(pos, eps, out=pos)
    return np.log(pos, out=pos).astype(np.float32)


# ---- the tool index ----------------------------------------------------------------------------
def dense_scores_one(index: ToolIndex, query: np.ndarray) -> np.ndarray:
    """:meth:`ToolIndex.dense_scores` for one query ``[d]`` (numpy in, ``[N]`` float32 numpy out): the
    single-step path."""
    if index.exact:
        m64 = _matrix64(index)
        return (m64 @ np.asarray(query, dtype=np.float64)).astype(np.float32)  # [N]
    return index.dense_scores(torch.as_tensor(np.asarray(query, dtype=np.float32))[None])[0].numpy()

def vector_scores_one(index: ToolIndex, query: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(scores ``[N]`` float32, retrieved ``[T]`` or None) of one query: an exact index's
    :func:`dense_scores_one` and None; an approximate index's retrieved tools (best first) with their
    scores, ``-inf`` elsewhere, without a scan of the registry."""
    if index.exact:
        return dense_scores_one(index, query), None
    ids, top = index.top_one(query)                                                      # [T], [T]
    vec = np.full(len(index), -np.inf, dtype=np.float32)                                 # [N]
    vec[ids] = top
    return vec, ids

def top_scores_one(index: ToolIndex, query: np.ndarray, top: int,
                   include: np.ndarray | None = None) -> np.ndarray:
    """:func:`dense_scores_one` where only the leaders are needed: ``[N]`` float32 holding the exact
    score of every tool that can be among the ``top`` best (and of ``include``), ``-inf`` for the rest.

    For an exact index over a large registry a float32 matmul (half the memory traffic of the
    float64 one) finds the candidates: a float32 dot product of two vectors of norm at most 1
    is within ``d * 2**-23`` of the exact one (a bound for any summation order), so every tool
    whose exact score can reach the top-th exact score is kept and rescored exactly. Ordering
    the result as :func:`rank_one` does gives the same first ``top`` tools
    as the full scores. Small registries and approximate indexes get the full scores.
    """
    n = len(index)
    if not index.exact or n <= 2048 or top >= n // 4:
        return dense_scores_one(index, query)
    q64 = np.asarray(query, dtype=np.float64)
    approx = index.vectors @ q64.astype(np.float32)                                       # [N] float32
    norm = float(np.sqrt(q64 @ q64)) * _max_norm(index)
    slack = 2.0 * index.dim * 2.0 ** -23 * max(norm, 1.0)                                # twice the bound
    kth = np.partition(approx, n - top)[n - top]                                         # top-th largest
    cand = np.flatnonzero(approx >= kth - slack)
    if include is not None and len(include):
        cand = np.union1d(cand, include)
    out = np.full(n, -np.inf, dtype=np.float32)
    rows = _matrix64(index)[cand]
    out[cand] = (rows @ q64).astype(np.float32)
    return out

def _matrix64(index: ToolIndex) -> np.ndarray:
    """The tool matrix in float64, ``[N, d]`` (made once per index)."""
    if index not in _INDEX_CACHE:
        m64 = index.vectors.astype(np.float64)
        _INDEX_CACHE[index] = (m64, float(np.sqrt((m64 ** 2).sum(1).max())) if len(index) else 0.0)
    return _INDEX_CACHE[index][0]


def _max_norm(index: ToolIndex) -> float:
    _matrix64(index)
    return _INDEX_CACHE[index][1]


# ---- ranking -----------------------------------------------------------------------------------
def confidence_one(s: np.ndarray) -> float:
    """:func:`tracer.scorer_base.ranking.confidence` for the children of one state, ``s [C]`` (numpy)."""
    if len(s) == 0:
        return 0.0
    s64 = s.astype(np.float64)
    top = float(s64.max())
    if not math.isfinite(top):
        return 0.0
    np.subtract(s64, top, out=s64)
    return float(1.0 / np.exp(s64, out=s64).sum())


def rank_one(proposed: np.ndarray, scores: np.ndarray, fallback: np.ndarray, fell_back: bool,
             top: int | None = None) -> np.ndarray:
    """:func:`tracer.scorer_base.ranking.rank` for one step, in numpy (the single-step path): registry ids
    best first.

    ``proposed [C]`` registry ids (distinct) with their primary ``scores [C]`` (every other tool's
    primary score is ``-inf``), ``fallback [N]``. Returns the whole ranking, or only its first
    ``top`` entries (then large registries are partially sorted). Same order as ``rank``:
    proposed tools by score, ties by fallback then registry position; then the rest by fallback,
    then registry position; a step that fell back is ranked by fallback alone. As there, a
    ``-inf`` score ties with the tools not proposed and a NaN score ranks after them.
    """
    n = len(fallback)
    m = n if top is None else max(0, min(top, n))
    # [N] ascending = best first
    neg_fb = -np.asarray(fallback, dtype=np.float32)
    if np.isnan(neg_fb).any():  # NaN first, as in a torch sort: exact integer keys instead
        neg_fb = _desc_keys(-neg_fb, np.arange(n, dtype=np.uint64))
    head = last = np.zeros(0, dtype=np.int64)
    if not fell_back and len(proposed):
        s = np.asarray(scores, dtype=np.float32)
        if not np.isfinite(s).all():
            s = np.nan_to_num(s, nan=-np.inf)  # as in rank: +-inf -> largest/lowest float, NaN -> -inf
        p = np.asarray(proposed, dtype=np.int64)
        up = s > np.finfo(np.float32).min
        head = p[up][np.lexsort((p[up], neg_fb[p[up]], -s[up]))]
        last = p[s == -np.inf]                                                        # NaN scores
        last = last[np.lexsort((last, neg_fb[last]))]
    if len(head) >= m:
        return head[:m]
    need = m + len(last)  # the first `need` tools in fallback order hold the m - len(head) others
    if need < n and n > 512:
        kth = np.partition(neg_fb, need - 1)[need - 1]
        cand = np.flatnonzero(neg_fb <= kth)                                          # ties at the cut kept
        order = cand[np.argsort(neg_fb[cand], kind="stable")]
    else:
        order = np.argsort(neg_fb, kind="stable")                                     # [N]
    if len(head) or len(last):
        taken = np.zeros(n, dtype=bool)
        taken[head] = True
        taken[last] = True
        order = order[~taken[order]]
    return np.concatenate([head, order, last])[:m]


def finalize_one(proposed: np.ndarray, scores: np.ndarray, fallback: np.ndarray, fell_back: bool, k: int,
                 pad: bool = True, always_present: Sequence[int] = (),
                 present_all: bool = False) -> tuple[int, ...]:
    """:func:`tracer.scorer_base.ranking.finalize`'s presented set for one step: :func:`rank_one`'s first k,
    then the rule every presented set follows (:func:`tracer.scorer_base.ranking.present`)."""
    if present_all:
        return tuple(range(len(fallback)))
    top = rank_one(proposed, scores, fallback, fell_back, top=k)
    n_proposed = int(np.isfinite(np.asarray(scores, dtype=np.float32)).sum())
    return present(top.tolist(), k, pad, fell_back, n_proposed, always_present)
