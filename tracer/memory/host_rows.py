"""Reading a few rows of a tensor from numpy, without torch's per-op dispatch on the CPU, and summing rows by
group.

Why: an online update touches a handful of rows of the trie's and tracer_plus's tables. On this
2-core CPU each small torch op costs ~5-10 µs of dispatch, a numpy op on a view ~1-3 µs, and the
update of one BFCL trajectory is some sixty such ops per trie (``benchmarks/bench_update.py``). On the
CPU the rows are read through ``Tensor.numpy()`` views (shared memory, so writes into a view land
in the tensor); a tensor on another device, or of a dtype numpy lacks (bfloat16), is indexed by
torch and copied instead: slower, same numbers.
"""

from __future__ import annotations

import numpy as np
import torch


def host_view(t: torch.Tensor) -> np.ndarray | None:
    """A numpy view sharing ``t``'s memory, or None when there is none (another device, bfloat16)."""
    if not t.is_cpu or t.dtype is torch.bfloat16 or t.requires_grad:
        return None
    return t.numpy()


def to_host(t: torch.Tensor) -> np.ndarray:
    """``t`` as numpy: a view on the CPU, a copy otherwise (bfloat16 as float32)."""
    view = host_view(t)
    if view is not None:
        return view
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def take(t: torch.Tensor, idx: np.ndarray) -> np.ndarray:
    """``t[idx]`` as a numpy array (a copy of those rows only; bfloat16 as float32)."""
    view = host_view(t)
    if view is not None:
        return view[idx]
    rows = t.detach()[torch.from_numpy(np.asarray(idx, dtype=np.int64)).to(t.device)].cpu()
    return (rows.float() if rows.dtype == torch.bfloat16 else rows).numpy()


def group_sums(values: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``values [S, ...]`` summed by ``group [S]``: (distinct groups ascending ``[G]``, their sums
    ``[G, ...]``). The rows of a group are added in their order, one after the other (as torch's
    ``index_add_`` on the CPU), in one ``reduceat`` (``np.add.at`` costs ~0.1 ms per call on rows of 384
    numbers)."""
    order = np.argsort(group, kind="stable")
    g = group[order]
    # change: a group starts or ends
    change = np.empty(len(g) + 1, dtype=bool)
    change[0] = change[-1] = True
    np.not_equal(g[1:], g[:-1], out=change[1:-1])
    starts = np.flatnonzero(change)[:-1]                                                 # [G]
    if not len(starts):
        return g, values[:0].copy()
    return g[starts], np.add.reduceat(values[order], starts, axis=0)
