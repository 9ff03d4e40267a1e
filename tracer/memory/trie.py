"""The execution trie with its edge-memory tensors.

Every state (by default the turn-local prefix of tool calls) seen in training is a node; its
children are the tools called right after it. Per edge S->t we keep

- the transition count N(S, t); the empirical prior is P(t) = log(N(S,t)/N(S) + eps), stored per
  edge (``edge_log_p``);
- the edge memory m_{S,t}: the mean of the normalised context embeddings of the training steps
  that took the edge, renormalised, so that ``m . c`` is a cosine. Its norm before renormalising
  (``edge_norm``, the norm of the sum) is kept so that :meth:`ExecutionTrie.update` can add steps
  without holding a second ``[E, d]`` tensor of sums.

Layout: edges are sorted by (node, tool) and stored CSR-like, so the children of node ``u`` are the
contiguous rows ``indptr[u]:indptr[u+1]`` of ``edge_tool [E]``, ``edge_count [E]``,
``edge_log_p [E]`` and ``edge_memory [E, d]``.

The node table is a hash map from the state tuple to the node id: for ``key: prefix`` that is a
trie over tool-call prefixes (every prefix of a training turn is a node); other keys (``last_n``,
cross-turn) reuse the same machinery.

Arithmetic (one definition for the batched and the single-step paths): cosines are accumulated in
float64 from the float32 vectors and rounded to float32; the contextual prior is computed in
float64 from those float32 cosines and rounded to float32. Float64 accumulation makes the result
independent of the summation order of the kernel that computes it (BLAS gemv, gemm, a CUDA
reduction) up to float32 rounding, which is what lets :meth:`ExecutionTrie.gather` (torch, batched,
on any device) and :meth:`ExecutionTrie.children_one` (numpy, one step, CPU) agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch

from tracer.core.types import Step

_NEG_INF = float("-inf")
_MEM64_MAX = 1 << 22  # keep a float64 host copy of the edge memory up to this many numbers (32 MiB)
_WIDE, _WIDE64_BUDGET = 256, 256 << 20  # larger tries: float64 copies of nodes with >= 256 children, 256 MiB


@dataclass(frozen=True)
class StateKey:
    """Which calls form the state of a step.

    Args:
        kind: ``prefix`` (all calls in scope, the paper's default) or ``last_n`` (the last ``n``).
        n: how many calls ``last_n`` keeps.
        cross_turn: False (paper): the state resets at each user message. True: calls of earlier
            turns stay in the state.

    Example: a turn ``a, b`` then a user message and ``c``; the state before the call after ``c``
    is ``(c,)`` for ``prefix``, ``(a, b, c)`` for ``prefix`` + ``cross_turn``, ``(b, c)`` for
    ``last_n`` with n=2 + ``cross_turn``.
    """

    kind: Literal["prefix", "last_n"] = "prefix"
    n: int = 1
    cross_turn: bool = False

    def __post_init__(self):
        if self.kind not in ("prefix", "last_n"):
            raise ValueError(f"state key kind must be 'prefix' or 'last_n', got {self.kind!r}")
        if self.kind == "last_n" and self.n < 1:
            raise ValueError(f"last_n needs n >= 1, got {self.n}")

    @classmethod
    def from_config(cls, cfg: Mapping | None) -> StateKey:
        return cls(**dict(cfg or {}))

    def state(self, step: Step) -> tuple[str, ...]:
        calls = step.history if self.cross_turn else step.prefix
        return tuple(calls) if self.kind == "prefix" else tuple(calls[-self.n:])

    @property
    def label(self) -> str:
        base = "prefix" if self.kind == "prefix" else f"last_{self.n}"
        return base + ("+cross_turn" if self.cross_turn else "")


@dataclass
class ChildBatch:
    """The children of a batch of states, padded to the widest node in the batch.

    Shapes: B steps, C = max children in the batch.
    """

    node: torch.Tensor        # [B] node id, -1 for an unseen state
    tool: torch.Tensor        # [B, C] registry id of each child (0 where masked)
    mask: torch.Tensor        # [B, C] True for a real child
    count: torch.Tensor       # [B, C] N(S, t)
    node_count: torch.Tensor  # [B] N(S)
    log_p: torch.Tensor       # [B, C] empirical prior log(N(S,t)/N(S) + eps); -inf where masked
    sim: torch.Tensor         # [B, C] cosine of the context with the edge memory; -inf where masked
    log_l: torch.Tensor       # [B, C] contextual prior log(relu(sim)/sum + eps); -inf where masked
    depth: torch.Tensor       # [B] length of the state

    @property
    def n_children(self) -> torch.Tensor:  # [B]
        return self.mask.sum(1)


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


class ExecutionTrie:
    """Nodes, CSR edges, counts, priors and edge memories. Build with :meth:`build`, grow with :meth:`update`.

    Args:
        n_tools: registry size (tool ids are registry positions).
        dim: embedding dimension.
        key: how a step maps to its state.
        eps: smoothing of both priors' logs.
        device: where the tensors live (CUDA when present by default).
        dtype: of the edge memory (float32; float16 halves the memory of very large tries, the
            arithmetic stays float64).
    """

    def __init__(self, n_tools: int, dim: int, key: StateKey = StateKey(), eps: float = 1e-6,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        self.n_tools, self.dim, self.key, self.eps = n_tools, dim, key, eps
        self.device = torch.device(device)
        self.dtype = dtype
        self.nodes: dict[tuple[str, ...], int] = {}
        self.node_states: list[tuple[str, ...]] = []
        long = {"dtype": torch.long, "device": self.device}
        self.indptr = torch.zeros(1, **long)                                           # [U+1]
        self.edge_tool = torch.zeros(0, **long)                                        # [E]
        self.edge_count = torch.zeros(0, **long)                                       # [E]
        self.edge_log_p = torch.zeros(0, dtype=torch.float32, device=self.device)      # [E]
        self.edge_memory = torch.zeros(0, dim, dtype=dtype, device=self.device)        # [E, d]
        self.edge_norm = torch.zeros(0, dtype=torch.float32, device=self.device)       # [E] norm of the sum
        self.node_count = torch.zeros(0, **long)                                       # [U]
        self.node_depth = torch.zeros(0, **long)                                       # [U]
        self._host: _Host | None = None

    # ---- building --------------------------------------------------------------------------------
    def _node_ids(self, states: Iterable[tuple[str, ...]], create: bool) -> list[int]:
        get, ids = self.nodes.get, []
        for s in states:
            u = get(s)
            if u is None:
                if not create:
                    ids.append(-1)
                    continue
                u = self.nodes[s] = len(self.node_states)
                self.node_states.append(s)
            ids.append(u)
        return ids

    def edge_node(self) -> torch.Tensor:
        """The source node of every edge, ``[E]``."""
        return torch.repeat_interleave(torch.arange(len(self.indptr) - 1, device=self.device), self.indptr.diff())

    def update(self, states: Sequence[tuple[str, ...]], tools: torch.Tensor, contexts: torch.Tensor,
               chunk: int = 1 << 16) -> ExecutionTrie:
        """Add steps: ``states`` (len S), ``tools [S]`` gold registry ids, ``contexts [S, d]`` normalised.

        Existing edges keep their counts and sums; new states and edges are merged in sorted
        (node, tool) order, so the CSR layout stays valid. Untouched edges are copied unchanged; the
        K touched ones get ``memory x norm + new sum``, renormalised. Peak memory is the old and the
        new ``[E, d]`` memory plus ``[K, d]``.
        """
        if len(states) != len(tools) or len(states) != contexts.shape[0]:
            raise ValueError(f"update needs one tool and one context per state: {len(states)}, {len(tools)}, "
                             f"{contexts.shape[0]}")
        if contexts.ndim != 2 or contexts.shape[1] != self.dim:
            raise ValueError(f"contexts must be [S, {self.dim}], got {tuple(contexts.shape)}")
        tools = tools.to(self.device, torch.long)
        if len(tools) and (int(tools.min()) < 0 or int(tools.max()) >= self.n_tools):
            raise ValueError(f"tool ids must lie in [0, {self.n_tools})")
        n_old_nodes = self.n_nodes
        node = torch.tensor(self._node_ids(states, create=True), dtype=torch.long, device=self.device)  # [S]
        n_nodes = self.n_nodes
        # the new steps, reduced to their distinct edges
        new_key, inv = torch.unique(node * self.n_tools + tools, sorted=True, return_inverse=True)  # [K], [S]
        new_count = torch.bincount(inv, minlength=len(new_key))                                      # [K]
        new_sum = torch.zeros(len(new_key), self.dim, dtype=torch.float32, device=self.device)       # [K, d]
        for lo in range(0, len(inv), chunk):  # scatter_add_ (vectorised; index_add_ is row by row on CPU)
            part = contexts[lo:lo + chunk].to(self.device, torch.float32)
            new_sum.scatter_add_(0, inv[lo:lo + chunk, None].expand(-1, self.dim), part)
        # merge with the existing edges (both sorted by key)
        old_key = self.edge_node() * self.n_tools + self.edge_tool                                   # [E_old]
        key = torch.unique(torch.cat([old_key, new_key]), sorted=True)                                # [E]
        at_old, at_new = torch.searchsorted(key, old_key), torch.searchsorted(key, new_key)
        count = torch.zeros(len(key), dtype=torch.long, device=self.device)
        count[at_old] = self.edge_count
        count.index_add_(0, at_new, new_count)
        # untouched edges are moved as they are; only the K touched ones are recomputed (old sum = memory x norm)
        memory = torch.empty(len(key), self.dim, dtype=self.dtype, device=self.device)              # [E, d]
        norm = torch.empty(len(key), dtype=torch.float32, device=self.device)                       # [E]
        is_old = torch.zeros(len(key), dtype=torch.bool, device=self.device)
        is_old[at_old] = True
        # old rows move in runs between insertion points: one slice copy per run (memcpy speed)
        shift = at_old - torch.arange(len(at_old), device=self.device)                              # [E_old]
        starts = torch.cat([torch.zeros(1, dtype=torch.long, device=self.device),
                            (shift.diff() != 0).nonzero().squeeze(1) + 1, torch.tensor([len(at_old)], device=self.device)])
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()) if len(at_old) else ():
            dst = int(at_old[a])
            memory[dst:dst + b - a] = self.edge_memory[a:b]
            norm[dst:dst + b - a] = self.edge_norm[a:b]
        self.edge_memory = None  # free the old memory before the touched rows are recomputed
        was = is_old[at_new]                                                                          # [K]
        total = torch.where(was[:, None], memory[at_new].float() * norm[at_new, None], 0.0).add_(new_sum)  # [K, d]
        del new_sum
        norm[at_new] = torch.linalg.vector_norm(total, dim=1)
        memory[at_new] = total.div_(norm[at_new].clamp_min(1e-12)[:, None]).to(self.dtype)  # m . c is a cosine
        self.edge_memory = memory
        self.edge_norm = norm
        self.edge_count = count
        self.edge_tool = key % self.n_tools
        edge_node = key // self.n_tools
        self.indptr = torch.zeros(n_nodes + 1, dtype=torch.long, device=self.device)
        self.indptr[1:] = torch.bincount(edge_node, minlength=n_nodes).cumsum(0)
        self.node_count = torch.zeros(n_nodes, dtype=torch.long, device=self.device).index_add_(0, edge_node, count)
        new_depth = torch.tensor([len(s) for s in self.node_states[n_old_nodes:]], dtype=torch.long,
                                 device=self.device)
        self.node_depth = torch.cat([self.node_depth, new_depth])
        self.edge_log_p = empirical_prior(count, self.node_count[edge_node], self.eps)
        self._host = None
        return self

    @classmethod
    def build(cls, steps: Sequence[Step], tool_ids: torch.Tensor, contexts: torch.Tensor, n_tools: int,
              key: StateKey = StateKey(), eps: float = 1e-6, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> ExecutionTrie:
        trie = cls(n_tools, contexts.shape[1], key, eps, device, dtype)
        return trie.update([key.state(s) for s in steps], tool_ids, contexts)

    # ---- queries ---------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return len(self.node_states)

    @property
    def n_edges(self) -> int:
        return int(self.edge_tool.shape[0])

    def node(self, state: tuple[str, ...]) -> int:
        return self.nodes.get(tuple(state), -1)

    def children(self, state: tuple[str, ...]) -> dict[int, int]:
        """{tool id: count} of the children of a state (empty if unseen)."""
        u = self.node(state)
        if u < 0:
            return {}
        lo, hi = int(self.indptr[u]), int(self.indptr[u + 1])
        return dict(zip(self.edge_tool[lo:hi].tolist(), self.edge_count[lo:hi].tolist()))

    def lookup(self, steps: Sequence[Step]) -> torch.Tensor:
        """Node id of each step's state, ``[B]`` (-1 where unseen)."""
        return torch.tensor(self._node_ids((self.key.state(s) for s in steps), create=False), dtype=torch.long,
                            device=self.device)

    def gather(self, node: torch.Tensor, contexts: torch.Tensor | None, heavy: int = 4,
               chunk: int = 1 << 13) -> ChildBatch:
        """Children, priors and similarities for nodes ``[B]`` and contexts ``[B, d]``.

        ``contexts`` may be ``None`` when the caller needs no similarity (transition-only scorers):
        ``sim`` is then 0 on every child, with no cosine computed. Otherwise cosines are computed per
        node for nodes that several steps of the batch share (one small matmul each) and per
        (step, child) pair for the rest.
        """
        node = node.to(self.device)
        b = len(node)
        seen = node >= 0
        safe = node.clamp_min(0)
        if self.n_nodes:
            start = torch.where(seen, self.indptr[safe], 0)                               # [B]
            n_child = torch.where(seen, self.indptr[safe + 1] - start, 0)                 # [B]
        else:
            start = n_child = torch.zeros_like(node)
        width = max(int(n_child.max()) if b else 0, 1)
        offs = torch.arange(width, device=self.device)                                  # [C]
        mask = offs[None, :] < n_child[:, None]                                         # [B, C]
        edge = torch.where(mask, start[:, None] + offs[None, :], 0)                     # [B, C]
        if self.n_edges:
            tool = torch.where(mask, self.edge_tool[edge], 0)
            count = torch.where(mask, self.edge_count[edge], 0)
            log_p = torch.where(mask, self.edge_log_p[edge], _NEG_INF)
        else:
            tool = count = torch.zeros_like(edge)
            log_p = torch.full(edge.shape, _NEG_INF, device=self.device)
        node_count = torch.where(seen, self.node_count[safe], 0) if self.n_nodes else torch.zeros_like(node)
        depth = torch.where(seen, self.node_depth[safe], -1) if self.n_nodes else torch.full_like(node, -1)
        if contexts is None:
            sim = torch.where(mask, 0.0, _NEG_INF)                                       # [B, C]
        else:
            sim = self._sims(node, start, n_child, contexts, width, heavy, chunk)       # [B, C]
        log_l = contextual_prior(sim, mask, self.eps)
        return ChildBatch(node=node, tool=tool, mask=mask, count=count, node_count=node_count, log_p=log_p,
                          sim=sim, log_l=log_l, depth=depth)

    def _sims(self, node, start, n_child, contexts, width, heavy, chunk) -> torch.Tensor:
        """Cosines ``[B, C]`` (float32, -inf where masked), accumulated in float64."""
        b = len(node)
        sim = torch.full((b, width), _NEG_INF, dtype=torch.float64, device=self.device)
        rows = (n_child > 0).nonzero().squeeze(1)                                       # steps with children
        ctx = contexts.to(self.device, torch.float64)
        if ctx.shape[1] != self.dim:
            raise ValueError(f"contexts must be [B, {self.dim}], got {tuple(contexts.shape)}")
        if len(rows) == 0:
            return sim.float()
        # nodes shared by >= `heavy` steps: one matmul per node
        order = torch.argsort(node[rows], stable=True)
        rows = rows[order]
        uniq, counts = torch.unique_consecutive(node[rows], return_counts=True)
        big = counts >= heavy                                                            # [n_unique]
        ends = counts.cumsum(0)
        ub = uniq[big]
        for lo, hi, end, cnt in zip(self.indptr[ub].tolist(), self.indptr[ub + 1].tolist(), ends[big].tolist(),
                                    counts[big].tolist()):
            r = rows[end - cnt:end]
            mem = self.edge_memory[lo:hi].to(torch.float64)                              # [C_u, d]
            sim[r, : hi - lo] = ctx[r] @ mem.T                                           # [n_u, C_u]
        if not bool(big.all()):  # the other steps: one dot product per (step, child) pair
            r = rows[torch.repeat_interleave(~big, counts)]                              # [L]
            nc = n_child[r]
            pair_row = torch.repeat_interleave(r, nc)                                    # [P]
            first = torch.cumsum(nc, 0) - nc
            pair_off = torch.arange(len(pair_row), device=self.device) - torch.repeat_interleave(first, nc)  # [P]
            pair_edge = start[pair_row] + pair_off
            for lo in range(0, len(pair_row), chunk):  # bound the [p, d] temporaries
                pr, pe = pair_row[lo:lo + chunk], pair_edge[lo:lo + chunk]
                sim[pr, pair_off[lo:lo + chunk]] = (ctx[pr] * self.edge_memory[pe].to(torch.float64)).sum(1)
        return sim.float()

    # ---- the single-step path ----------------------------------------------------------------------
    def host(self) -> _Host:
        """CPU numpy views used by :meth:`children_one` (built once, dropped on update)."""
        if self._host is None:
            mem = self.edge_memory.detach().cpu()
            mem_np = mem.numpy() if mem.dtype != torch.bfloat16 else mem.float().numpy()
            self._host = _Host(
                indptr=self.indptr.tolist(), tool=self.edge_tool.cpu().numpy(), count=self.edge_count.cpu().numpy(),
                log_p=self.edge_log_p.cpu().numpy(), mem=mem_np,
                mem64=mem_np.astype(np.float64) if mem_np.size <= _MEM64_MAX else None, wide64={},
                wide_budget=_WIDE64_BUDGET)
        return self._host

    def children_one(self, state: tuple[str, ...], context: np.ndarray | None) -> OneStep:
        """The children of one state scored against one context ``[d]`` (float64 or float32): numpy, CPU.

        Same arithmetic as :meth:`gather`, bit for bit.
        """
        h = self.host()
        u = self.nodes.get(state, -1)
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
        return OneStep(u, h.tool[lo:hi], h.count[lo:hi], h.log_p[lo:hi], sim, contextual_prior_one(sim, self.eps))

    # ---- persistence -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Tensors and config; states as token ids into a vocabulary (compact for millions of nodes)."""
        vocab: dict[str, int] = {}
        tokens = [vocab.setdefault(name, len(vocab)) for s in self.node_states for name in s]
        lengths = torch.tensor([len(s) for s in self.node_states], dtype=torch.long)
        return {
            "config": {"n_tools": self.n_tools, "dim": self.dim, "key": asdict(self.key), "eps": self.eps,
                       "dtype": str(self.dtype).removeprefix("torch.")},
            "vocab": list(vocab), "state_tokens": torch.tensor(tokens, dtype=torch.int32), "state_lengths": lengths,
            "indptr": self.indptr.cpu(), "edge_tool": self.edge_tool.cpu(), "edge_count": self.edge_count.cpu(),
            "edge_log_p": self.edge_log_p.cpu(), "edge_memory": self.edge_memory.cpu(), "edge_norm": self.edge_norm.cpu(),
        }

    @classmethod
    def from_state_dict(cls, sd: dict, device: str | torch.device = "cpu") -> ExecutionTrie:
        c = sd["config"]
        trie = cls(c["n_tools"], c["dim"], StateKey(**c["key"]), c["eps"], device, getattr(torch, c["dtype"]))
        vocab = sd["vocab"]
        names = [vocab[i] for i in sd["state_tokens"].tolist()]
        ends = sd["state_lengths"].cumsum(0).tolist()
        trie.node_states = [tuple(names[e - n:e]) for e, n in zip(ends, sd["state_lengths"].tolist())]
        trie.nodes = {s: i for i, s in enumerate(trie.node_states)}
        if len(trie.nodes) != len(trie.node_states):
            raise ValueError("trie state dict holds duplicate states")
        for name in ("indptr", "edge_tool", "edge_count", "edge_log_p", "edge_memory", "edge_norm"):
            setattr(trie, name, sd[name].to(trie.device))
        if len(trie.indptr) != trie.n_nodes + 1 or int(trie.indptr[-1]) != trie.n_edges:
            raise ValueError(f"trie state dict is inconsistent: {trie.n_nodes} states, indptr of {len(trie.indptr)}, "
                             f"{trie.n_edges} edges")
        trie.node_count = torch.zeros(trie.n_nodes, dtype=torch.long, device=trie.device).index_add_(
            0, trie.edge_node(), trie.edge_count)
        trie.node_depth = sd["state_lengths"].to(trie.device)
        return trie

    def nbytes(self) -> int:
        """Bytes held by the trie's tensors (not the Python node table)."""
        ts = (self.indptr, self.edge_tool, self.edge_count, self.edge_log_p, self.edge_memory, self.edge_norm,
              self.node_count, self.node_depth)
        return sum(t.element_size() * t.nelement() for t in ts)


def empirical_prior(count: torch.Tensor, node_count: torch.Tensor, eps: float) -> torch.Tensor:
    """P = log(N(S,t)/N(S) + eps) per edge, computed in float64, stored float32."""
    return torch.log(count.double() / node_count.double().clamp_min(1) + eps).float()


def contextual_prior(sim: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """L = log(relu(sim) / sum_children relu(sim) + eps), uniform over the children if every sim <= 0.

    ``sim [B, C]``, ``mask [B, C]`` -> ``[B, C]`` float32 with -inf where masked (float64 inside).
    """
    pos = sim.double().clamp_min(0).masked_fill_(~mask, 0.0)            # [B, C] relu, 0 where masked
    total = pos.sum(1, keepdim=True)                                    # [B, 1]
    uniform = mask.double() / mask.sum(1, keepdim=True).clamp_min(1)    # [B, C] 1/n over the children
    prob = torch.where(total > 0, pos / total, uniform)                 # 0/0 rows are replaced by uniform
    return torch.log(prob.add_(eps)).float().masked_fill_(~mask, _NEG_INF)


def contextual_prior_one(sim: np.ndarray, eps: float) -> np.ndarray:
    """:func:`contextual_prior` for the children of one state, ``[C]`` float32 -> ``[C]`` float32 (numpy)."""
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
