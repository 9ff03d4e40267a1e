"""The execution trie with its edge-memory tensors.

Every state (by default the turn-local prefix of tool calls) seen in training is a node; its
children are the tools called right after it. Per edge S->t we keep

- the transition count N(S, t); the empirical prior is P(t) = log(N(S,t)/N(S) + eps), stored per
  edge (``edge_log_p``);
- the edge memory m_{S,t}: the mean of the normalised context embeddings of the training steps
  that took the edge, renormalised, so that ``m . c`` is a cosine. Its norm before renormalising
  (``edge_norm``, the norm of the sum) is kept so that :meth:`ExecutionTrie.update` can add steps
  without holding a second ``[E, d]`` tensor of sums.

Layout: the node table and CSR counts of :class:`tracer.memory.transitions.TransitionTable`
(edges sorted by (node, tool); the children of node ``u`` are rows ``indptr[u]:indptr[u+1]``),
extended with ``edge_log_p [E]`` and ``edge_memory [E, d]``. For ``key: prefix`` the node table is
a trie over tool-call prefixes (every prefix of a training turn is a node); other keys (``last_n``,
cross-turn) reuse the same machinery.

Arithmetic (one definition for the batched and the single-step paths): cosines are accumulated in
float64 from the float32 vectors and rounded to float32; the contextual prior is computed in
float64 from those float32 cosines and rounded to float32. Float64 accumulation makes the result
independent of the summation order of the kernel that computes it (BLAS gemv, gemm, a CUDA
reduction) up to float32 rounding, which is what lets :meth:`ExecutionTrie.gather` (torch, batched,
on any device) and :func:`tracer.scorer_base.single_step.children_one` (numpy, one step, CPU) agree bit for
bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from tracer.core.types import Step
from tracer.memory.keys import PREFIX, StateKey
from tracer.memory.priors import contextual_prior, empirical_prior
from tracer.memory.transitions import Transitions, TransitionTable

_NEG_INF = float("-inf")


@dataclass
class ChildBatch(Transitions):
    """:class:`Transitions` with the priors and similarities of each child (B steps, C children).

    log_p: ``[B, C]`` empirical prior log(N(S,t)/N(S) + eps); -inf where masked.
    sim: ``[B, C]`` cosine of the context with the edge memory; -inf where masked.
    log_l: ``[B, C]`` contextual prior log(relu(sim)/sum + eps); -inf where masked.
    """

    log_p: torch.Tensor
    sim: torch.Tensor
    log_l: torch.Tensor


class ExecutionTrie(TransitionTable):
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

    def __init__(self, n_tools: int, dim: int, key: StateKey = PREFIX, eps: float = 1e-6,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        super().__init__(n_tools, key, device)
        self.dim, self.eps = dim, eps
        self.dtype = dtype
        self.edge_log_p = torch.zeros(0, dtype=torch.float32, device=self.device)      # [E]
        self.edge_memory = torch.zeros(0, dim, dtype=dtype, device=self.device)        # [E, d]
        self.edge_norm = torch.zeros(0, dtype=torch.float32, device=self.device)       # [E] norm of the sum
        self.single_step_cache = None  # CPU copies made by tracer.scorer_base.single_step; dropped on update

    # ---- building --------------------------------------------------------------------------------
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
        # untouched edges are moved as they are; only the K touched ones are recomputed (old sum = memory x
        # norm)
        memory = torch.empty(len(key), self.dim, dtype=self.dtype, device=self.device)              # [E, d]
        norm = torch.empty(len(key), dtype=torch.float32, device=self.device)                       # [E]
        is_old = torch.zeros(len(key), dtype=torch.bool, device=self.device)
        is_old[at_old] = True
        # old rows move in runs between insertion points: one slice copy per run (memcpy speed)
        shift = at_old - torch.arange(len(at_old), device=self.device)                              # [E_old]
        starts = torch.cat([torch.zeros(1, dtype=torch.long, device=self.device),
                            (shift.diff() != 0).nonzero().squeeze(1) + 1,
                            torch.tensor([len(at_old)], device=self.device)])
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()) if len(at_old) else ():
            dst = int(at_old[a])
            memory[dst:dst + b - a] = self.edge_memory[a:b]
            norm[dst:dst + b - a] = self.edge_norm[a:b]
        self.edge_memory = None  # free the old memory before the touched rows are recomputed
        was = is_old[at_new]                                                                          # [K]
        total = torch.where(was[:, None], memory[at_new].float() * norm[at_new, None],
                            0.0).add_(new_sum)                                                        # [K, d]
        del new_sum
        norm[at_new] = torch.linalg.vector_norm(total, dim=1)
        # m . c is a cosine
        memory[at_new] = total.div_(norm[at_new].clamp_min(1e-12)[:, None]).to(self.dtype)
        self.edge_memory = memory
        self.edge_norm = norm
        edge_node = self._set_edges(key, count, n_old_nodes)
        self.edge_log_p = empirical_prior(count, self.node_count[edge_node], self.eps)
        self.single_step_cache = None
        return self

    @classmethod
    def build(cls, steps: Sequence[Step], tool_ids: torch.Tensor, contexts: torch.Tensor, n_tools: int,
              key: StateKey = PREFIX, eps: float = 1e-6, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> ExecutionTrie:
        trie = cls(n_tools, contexts.shape[1], key, eps, device, dtype)
        return trie.update([key.state(s) for s in steps], tool_ids, contexts)

    # ---- queries ---------------------------------------------------------------------------------
    def gather(self, node: torch.Tensor, contexts: torch.Tensor | None, heavy: int = 4,
               chunk: int = 1 << 13) -> ChildBatch:
        """Children, priors and similarities for nodes ``[B]`` and contexts ``[B, d]``.

        ``contexts`` may be ``None`` when the caller needs no similarity (transition-only scorers):
        ``sim`` is then 0 on every child, with no cosine computed. Otherwise cosines are computed per
        node for nodes that several steps of the batch share (one small matmul each) and per
        (step, child) pair for the rest.
        """
        t, start, n_child, edge = self.slots(node)
        node, mask = t.node, t.mask
        width = mask.shape[1]
        if self.n_edges:
            log_p = torch.where(mask, self.edge_log_p[edge], _NEG_INF)
        else:
            log_p = torch.full(edge.shape, _NEG_INF, device=self.device)
        if contexts is None:
            sim = torch.where(mask, 0.0, _NEG_INF)                                       # [B, C]
        else:
            sim = self._sims(node, start, n_child, contexts, width, heavy, chunk)       # [B, C]
        log_l = contextual_prior(sim, mask, self.eps)
        return ChildBatch(node=node, tool=t.tool, mask=mask, count=t.count, node_count=t.node_count,
                          depth=t.depth, log_p=log_p, sim=sim, log_l=log_l)

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
        big = counts >= min(heavy, len(rows))  # [n_unique]; a batch of one is one matmul (no pair indexing)
        ends = counts.cumsum(0)
        ub = uniq[big]
        for lo, hi, end, cnt in zip(self.indptr[ub].tolist(), self.indptr[ub + 1].tolist(),
                                    ends[big].tolist(), counts[big].tolist()):
            r = rows[end - cnt:end]
            mem = self.edge_memory[lo:hi].to(torch.float64)                              # [C_u, d]
            sim[r, : hi - lo] = ctx[r] @ mem.T                                           # [n_u, C_u]
        if not bool(big.all()):  # the other steps: one dot product per (step, child) pair
            r = rows[torch.repeat_interleave(~big, counts)]                              # [L]
            nc = n_child[r]
            pair_row = torch.repeat_interleave(r, nc)                                    # [P]
            first = torch.cumsum(nc, 0) - nc
            pair_off = (torch.arange(len(pair_row), device=self.device)
                        - torch.repeat_interleave(first, nc))                            # [P]
            pair_edge = start[pair_row] + pair_off
            for lo in range(0, len(pair_row), chunk):  # bound the [p, d] temporaries
                pr, pe = pair_row[lo:lo + chunk], pair_edge[lo:lo + chunk]
                sim[pr, pair_off[lo:lo + chunk]] = (ctx[pr] * self.edge_memory[pe].to(torch.float64)).sum(1)
        return sim.float()

    # ---- persistence -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Tensors and config; states as token ids into a vocabulary (compact for millions of nodes)."""
        vocab: dict[str, int] = {}
        tokens = [vocab.setdefault(name, len(vocab)) for s in self.node_states for name in s]
        lengths = torch.tensor([len(s) for s in self.node_states], dtype=torch.long)
        return {
            "config": {"n_tools": self.n_tools, "dim": self.dim, "key": asdict(self.key), "eps": self.eps,
                       "dtype": str(self.dtype).removeprefix("torch.")},
            "vocab": list(vocab), "state_tokens": torch.tensor(tokens, dtype=torch.int32),
            "state_lengths": lengths, "indptr": self.indptr.cpu(), "edge_tool": self.edge_tool.cpu(),
            "edge_count": self.edge_count.cpu(), "edge_log_p": self.edge_log_p.cpu(),
            "edge_memory": self.edge_memory.cpu(), "edge_norm": self.edge_norm.cpu(),
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
            raise ValueError(f"trie state dict is inconsistent: {trie.n_nodes} states, "
                             f"indptr of {len(trie.indptr)}, {trie.n_edges} edges")
        trie.node_count = torch.zeros(trie.n_nodes, dtype=torch.long, device=trie.device).index_add_(
            0, trie.edge_node(), trie.edge_count)
        trie.node_depth = sd["state_lengths"].to(trie.device)
        return trie

    def nbytes(self) -> int:
        """Bytes held by the trie's tensors (not the Python node table)."""
        ts = (self.indptr, self.edge_tool, self.edge_count, self.edge_log_p, self.edge_memory, self.edge_norm,
              self.node_count, self.node_depth)
        return sum(t.element_size() * t.nelement() for t in ts)
