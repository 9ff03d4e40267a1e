"""The one place where scores become rankings and presented sets, plus the small tensor helpers scorers share.

:func:`finalize` turns :class:`~tracer.scorer_base.records.Scores` into a full ranking and the presented
set at a budget ``k``: proposed tools first in the scorer's order, then the rest of the registry in
fallback order (padding), ties broken by registry position; then the always-present tools, or the
whole registry for a scorer that presents all. Scorers never sort or pad by themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tracer.scorer_base.records import Scores, Selection

__all__ = ["confidence", "finalize", "no_proposal", "present", "present_without", "rank", "scatter_primary",
           "without"]


def _desc_keys(x: np.ndarray, low: np.ndarray) -> np.ndarray:
    """uint64 sort keys: ascending key order = ``x`` (float32) descending, then ``low`` (< 2**32) ascending.

    The float is mapped to its order-preserving bit pattern; ``-0.0`` counts as ``0.0`` and NaN as
    larger than ``+inf`` (as in a torch sort). Keys are unique when ``low`` is, so any sort
    algorithm gives the order of a stable sort.
    """
    x = np.asarray(x, dtype=np.float32) + np.float32(0.0)                             # -0.0 -> +0.0
    x = np.where(np.isnan(x), np.float32(np.nan), x)                                   # one NaN bit pattern
    u = x.view(np.uint32)
    order_bits = np.where(u >> 31 == 1, ~u, u | np.uint32(0x80000000))                 # ascending in x
    return ((~order_bits).astype(np.uint64) << np.uint64(32)) | low.astype(np.uint64)


def rank(primary: torch.Tensor, fallback: torch.Tensor, fell_back: torch.Tensor) -> torch.Tensor:
    """Full rankings ``[B, N]``: by primary (desc), then fallback (desc), then registry position.

    Rows that fell back are ranked by fallback alone. Done as two sorts on unique integer keys
    (fallback then registry position; primary then fallback rank), which gives exactly the order
    of two stable sorts without mixing the two score scales.
    """
    prim = primary.detach().float().cpu().numpy()
    fb = fallback.detach().float().cpu().numpy()
    fell = fell_back.detach().cpu().numpy().astype(bool)
    b, n = fb.shape
    ids = np.broadcast_to(np.arange(n, dtype=np.uint64), (b, n))
    by_fallback = np.argsort(_desc_keys(fb, ids), axis=1)                              # [B, N]
    out = by_fallback.copy()
    rows = np.flatnonzero(~fell)
    if len(rows) and n:
        fb_rank = np.empty((len(rows), n), dtype=np.uint64)
        np.put_along_axis(fb_rank, by_fallback[rows], np.broadcast_to(np.arange(n, dtype=np.uint64),
                                                                      (len(rows), n)), axis=1)
        p = np.nan_to_num(prim[rows], nan=-np.inf)  # as torch.nan_to_num: NaN below -inf (-> lowest float)
        out[rows] = np.argsort(_desc_keys(p, fb_rank), axis=1)                         # [R, N]
    return torch.from_numpy(out)


def finalize(scores: Scores, k: int, pad: bool = True) -> Selection:
    """Rank, take the top k, pad (or not) and add the always-present tools: the one place that does it."""
    ranking = rank(scores.primary, scores.fallback, scores.fell_back)  # [B, N]
    b, n = ranking.shape
    if scores.present_all:
        everything = tuple(range(n))
        return Selection(ranking, [everything] * b, scores)
    fell = scores.fell_back.tolist()
    n_prop = [k] * b
    if not pad:
        proposed = torch.isfinite(scores.primary.detach().cpu()) & ~scores.fell_back.detach().cpu()[:, None]
        n_prop = proposed.sum(1).tolist()
    reserve = scores.reserve if scores.reserve is not None else [None] * b
    presented = [present(t, k, pad, f, c, scores.always_present, r, scores.reserve_slots)
                 for t, f, c, r in zip(ranking[:, :k].tolist(), fell, n_prop, reserve)]
    return Selection(ranking, presented, scores)


def present(top: Sequence[int], k: int, pad: bool, fell_back: bool, n_proposed: int,
            always: Sequence[int] = (), reserve: Sequence[int] | None = None,
            slots: int = 1) -> tuple[int, ...]:
    """One step's presented set from the first ``k`` ids of its ranking ``top``: without padding only its
    ``n_proposed`` proposed tools (unless it fell back), the last slots given to ``reserve``'s claimants
    (:func:`reserved`; None: no reserved slots), then the ``always``-present ids not there yet. The rule
    :func:`finalize` applies to every row of a batch and a live step to its one row."""
    top = tuple(top[:k])
    if not pad and not fell_back:
        top = top[:min(k, n_proposed)]
    if reserve is not None:
        top = reserved(top, reserve, k, slots)
    return top + tuple(g for g in always if g not in top)


def reserved(top: Sequence[int], reserve: Sequence[int], k: int, slots: int = 1) -> tuple[int, ...]:
    """``top`` (a step's first k, or fewer without padding) with its last ``slots`` slots given to the first
    ids of ``reserve`` not presented before those slots, in ``reserve``'s order, after what is left of ``top``
    (appended where ``top`` is short); fewer such ids take fewer slots, none leaves ``top`` as it is. The
    first slot is always ``top``'s own (at most ``k - 1`` slots are reserved; none at k = 1), so a reserved
    slot never moves recall@1 and a step never presents more than k tools."""
    slots = min(slots, k - 1)
    head = tuple(top[:max(k - slots, 0)])
    new = tuple(r for r in reserve if r not in head)[:max(slots, 0)]
    if not new:
        return tuple(top)
    rest = tuple(t for t in top[len(head):] if t not in new)[:max(k - len(head) - len(new), 0)]
    return head + rest + new


def no_proposal(b: int, n: int) -> torch.Tensor:
    return torch.full((b, n), float("-inf"))


def scatter_primary(tool: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """Scatter per-child scores ``[B, C]`` (masked) into registry-wide scores ``[B, N]`` (-inf elsewhere)."""
    out = torch.full((tool.shape[0], n + 1), float("-inf"), dtype=values.dtype, device=values.device)
    idx = torch.where(mask, tool, torch.full_like(tool, n))  # masked entries land in a dump column
    out.scatter_(1, idx, torch.where(mask, values, torch.full_like(values, float("-inf"))))
    return out[:, :n]


def confidence(s: torch.Tensor) -> torch.Tensor:
    """kappa = max_t softmax(s)(t) per row of ``s [B, C]`` (-inf where masked), in float64; 0 for a row
    without a finite score."""
    s64 = s.double()
    top = (s64.max(1).values if s64.shape[1]
           else torch.full((s64.shape[0],), float("-inf"), dtype=torch.float64))
    ok = torch.isfinite(top)
    z = torch.exp(s64 - torch.where(ok, top, 0.0)[:, None]).sum(1)                # [B]
    return torch.where(ok, 1.0 / z, 0.0)


def without(ranking, removed, k: int | None = None) -> tuple[int, ...]:
    """A ranking (registry ids, best first; any iterable or ``[N]`` array) without the ``removed`` ids (the
    tools drift masked out, :attr:`Resources.removed`), cut to ``k`` when given."""
    ids = ranking if isinstance(ranking, np.ndarray) else np.fromiter(ranking, dtype=np.int64)
    kept = ids[~np.isin(ids, list(removed))] if removed else ids
    return tuple((kept if k is None else kept[:k]).tolist())


def present_without(ranking, removed, k: int, always=()) -> tuple[int, ...]:
    """The presented set of a ranking once drift removed tools (``removed``: registry ids): its first ``k``
    ids not removed, then the always-present ids (a scorer's ``global_set``) neither removed nor already
    there, each tool once as :func:`finalize` presents them."""
    head = without(ranking, removed, k)
    return head + tuple(g for g in without(always, removed) if g not in head)
