"""What ``tracer_plus``'s features are read from: its tries and the tables derived from them.

:class:`PlusIndex` holds one trie per key with its state tables (log visits and log children per
node) and the per-tool tables (log frequency, tool memory) read off the first trie. It is derived
from the tries alone (nothing else to save). :meth:`PlusIndex.build` computes every entry;
:meth:`PlusIndex.updated`, after an online update has added steps to the tries in place, recomputes
only the entries those steps touched (their nodes, new ones included, and their gold tools) and
keeps the rest: O(touched) instead of O(nodes + edges x d) per update. Both run the same code on
their entries (:meth:`StateTables.of`, :func:`tool_rows`), so an updated index equals a build on
the updated tries bit for bit (tested in ``tests/integration/online``).

Arithmetic is numpy on the host (an update touches a few entries; torch's per-op dispatch would
cost more than the work; the tables equal, bit for bit, those of the torch code this replaced, on
BFCL). The torch tables live on the tries' device: on the CPU they share memory with the numpy
ones, so an update writes both at once; elsewhere an update uploads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tracer.memory.host_rows import group_sums, take, to_host
from tracer.memory.trie import ExecutionTrie


def log1p32(x: np.ndarray) -> np.ndarray:
    """log(1 + x) of counts: float64 inside, rounded to float32."""
    return np.log1p(np.asarray(x, dtype=np.float64)).astype(np.float32)


def log_rank_table(n: int) -> np.ndarray:
    """log(rank) for ranks 1..n, float32 ``[n]``."""
    return np.log(np.arange(1, n + 1, dtype=np.float64)).astype(np.float32)


def _grown(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` itself when it has ``n`` rows (updated in place), else a copy with zero rows appended
    (tries and registries only grow: new nodes and tools take the next ids)."""
    if len(a) > n:
        raise ValueError(f"a table of {len(a)} rows cannot shrink to {n}: tries and registries only grow")
    return a if len(a) == n else np.concatenate([a, np.zeros((n - len(a), *a.shape[1:]), dtype=a.dtype)])


def _on(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` as a tensor on ``device``: the same memory on the CPU, a copy elsewhere."""
    t = torch.from_numpy(a)
    return t if device.type == "cpu" else t.to(device)


@dataclass
class StateTables:
    """Per-node state features of one trie, float32 ``[U]`` each, on the trie's device and as numpy."""

    log_visits: torch.Tensor
    log_children: torch.Tensor
    log_visits_np: np.ndarray
    log_children_np: np.ndarray

    @classmethod
    def of(cls, trie: ExecutionTrie, old: StateTables | None = None,
           nodes: np.ndarray | None = None) -> StateTables:
        """The tables of ``trie``. With ``old`` (its tables before an update) and ``nodes`` (every node the
        update's steps reached, new ones included: no other node's count or children changed), only
        those entries are recomputed; ``old``'s arrays are reused, so ``old`` must not serve any more."""
        if old is None:
            lv, lc, nodes = (np.zeros(trie.n_nodes, np.float32), np.zeros(trie.n_nodes, np.float32),
                             np.arange(trie.n_nodes))
        else:
            lv, lc = _grown(old.log_visits_np, trie.n_nodes), _grown(old.log_children_np, trie.n_nodes)
        indptr = to_host(trie.indptr)
        # [2V]
        both = log1p32(np.concatenate([take(trie.node_count, nodes), indptr[nodes + 1] - indptr[nodes]]))
        lv[nodes], lc[nodes] = both[:len(nodes)], both[len(nodes):]
        if (old is not None and lv is old.log_visits_np and lc is old.log_children_np
                and trie.device.type == "cpu"):
            # written through: the tensors share the arrays
            return cls(old.log_visits, old.log_children, lv, lc)
        return cls(_on(lv, trie.device), _on(lc, trie.device), lv, lc)


def tool_rows(trie: ExecutionTrie | None, tools: np.ndarray, dim: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Log frequency ``[K]``, memory ``[K, d]`` (float32) and mass ``[K]`` (float64) of ``tools`` (ascending
    ids) read off ``trie``'s edges: the number of steps that called each tool, the normalised sum of their
    contexts (0 for a tool never called) and that sum's norm (0 likewise). Sums run over the tool's edges in
    edge order, in float64."""
    # [K, d + 1]: sums | count
    total = np.zeros((len(tools), dim + 1), dtype=np.float64)
    if trie is not None and trie.n_edges and len(tools):
        edge_tool = to_host(trie.edge_tool)
        wanted = np.zeros(trie.n_tools, dtype=bool)
        wanted[tools] = True
        # their edges, in order
        sel = np.flatnonzero(wanted[edge_tool])
        per_edge = np.empty((len(sel), dim + 1), dtype=np.float64)                       # [E', d + 1]
        # memory x norm = the sum
        np.multiply(take(trie.edge_memory, sel), take(trie.edge_norm, sel)[:, None], out=per_edge[:, :dim],
                    dtype=np.float64)
        per_edge[:, dim] = take(trie.edge_count, sel)
        called, sums = group_sums(per_edge, edge_tool[sel])                           # by tool, in edge order
        total[np.searchsorted(tools, called)] = sums
    total, count = total[:, :dim], total[:, dim]
    mass = np.sqrt((total * total).sum(1))                                                # [K]
    return log1p32(count), (total / np.maximum(mass, 1e-12)[:, None]).astype(np.float32), mass


@dataclass
class PlusIndex:
    """Everything the features are read from: one trie per key with its state tables, per-tool
    tables and the log-rank table (see the module docstring).

    ``tool_log_freq [N]``: log(1 + number of training steps that called t); ``tool_memory [N, d]``:
    the normalised mean context of those steps (0 for a tool never called), i.e. the edge memory
    of an empty state; ``tool_mass64 [N]``: the norm of their contexts' sum (``mass * memory`` is the sum the
    usage vectors add, :mod:`tracer.scorer_base.usage`); all read off the first trie (every training step is
    one edge of it).
    """

    tries: list[ExecutionTrie]
    tables: list[StateTables]
    tool_log_freq: torch.Tensor   # [N] float32
    tool_memory: torch.Tensor     # [N, d] float32
    log_ranks: np.ndarray         # [N] float32
    tool_id: dict[str, int]
    tool_log_freq_np: np.ndarray
    tool_memory64: np.ndarray     # [N, d] float64
    tool_mass64: np.ndarray       # [N] float64

    @classmethod
    def build(cls, tries: Sequence[ExecutionTrie], names: Sequence[str], dim: int) -> PlusIndex:
        n = len(names)
        device = tries[0].device if tries else torch.device("cpu")
        freq, memory, mass = tool_rows(tries[0] if tries else None, np.arange(n), dim)
        return cls(list(tries), [StateTables.of(t) for t in tries], _on(freq, device), _on(memory, device),
                   log_rank_table(n), {name: i for i, name in enumerate(names)}, freq,
                   memory.astype(np.float64), mass)

    def updated(self, names: Sequence[str], nodes: Sequence[np.ndarray], tools: np.ndarray) -> PlusIndex:
        """This index after its tries had steps added in place
        (:func:`tracer.online.incremental.update_scorer`): ``nodes[j]`` the nodes of trie j those steps
        reached, ``tools`` their gold ids; ``names`` the registry, which may have grown (a renamed registry
        needs :meth:`build`). Equal to :meth:`build` on the updated tries; reuses this index's arrays, so
        this one must not serve any more."""
        n, dim = len(names), self.tool_memory64.shape[1]
        device = self.tries[0].device if self.tries else torch.device("cpu")
        tables = [StateTables.of(t, old, np.asarray(u, dtype=np.int64))
                  for t, old, u in zip(self.tries, self.tables, nodes)]
        freq, mem64 = _grown(self.tool_log_freq_np, n), _grown(self.tool_memory64, n)
        mass = _grown(self.tool_mass64, n)
        memory = _grown(to_host(self.tool_memory), n)                                    # [N, d] float32
        tools = np.unique(np.asarray(tools, dtype=np.int64))
        freq[tools], memory[tools], mass[tools] = tool_rows(self.tries[0] if self.tries else None, tools, dim)
        mem64[tools] = memory[tools]
        same = n == len(self.tool_id)
        if same and device.type == "cpu":  # written through: the tensors share these arrays
            freq_t, memory_t = self.tool_log_freq, self.tool_memory
        else:
            freq_t, memory_t = _on(freq, device), _on(memory, device)
        return PlusIndex(self.tries, tables, freq_t, memory_t,
                         self.log_ranks if same else log_rank_table(n),
                         self.tool_id if same else {name: i for i, name in enumerate(names)}, freq, mem64,
                         mass)


def refreshed(index: PlusIndex | None, tries: Sequence[ExecutionTrie], names: Sequence[str], dim: int,
              touched: tuple[Sequence[np.ndarray], np.ndarray] | None = None) -> PlusIndex:
    """``index`` updated where ``touched`` = (nodes per trie, gold ids) says, when ``tries`` are its own tries
    after an online update (:meth:`PlusIndex.updated`); otherwise :meth:`PlusIndex.build` on ``tries``."""
    if touched is not None and index is not None and all(a is b for a, b in zip(tries, index.tries)):
        return index.updated(names, *touched)
    return PlusIndex.build(tries, names, dim)
