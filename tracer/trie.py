"""The execution trie with its edge-memory tensors.

Every state (by default the turn-local prefix of tool calls) seen in training is a node; its
children are the tools called right after it. Per edge S->t we keep

- the transition count N(S, t) (the empirical prior is log(N(S,t)/N(S) + eps)), and
- the sum of the normalised context embeddings of the steps that took the edge; their mean,
  renormalised, is the edge memory used by the contextual prior.

Layout: edges are sorted by (node, tool) and stored CSR-like, so the children of node ``u`` are the
contiguous rows ``indptr[u]:indptr[u+1]`` of ``edge_tool [E]``, ``edge_count [E]`` and
``edge_memory [E, d]``. Scoring a batch of nodes is one gather and one batched mat-vec.

The node table is a hash map from the state tuple to the node id: for ``key: prefix`` that is a
trie over tool-call prefixes (every prefix of a training turn is a node); other keys (``last_n``,
cross-turn) reuse the same machinery.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Literal, Mapping, Sequence

import torch

from .types import Step


@dataclass(frozen=True)
class StateKey:
    """Which calls form the state of a step.

    Args:
        kind: ``prefix`` (all calls in scope, the paper's default) or ``last_n`` (the last ``n``).
        n: how many calls ``last_n`` keeps.
        cross_turn: False (paper): the state resets at each user message. True: calls of earlier
            turns stay in the state.
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


class ExecutionTrie:
    """Nodes, CSR edges, counts and edge memories. Build with :meth:`build`, grow with :meth:`update`.

    Args:
        n_tools: registry size (tool ids are registry positions).
        dim: embedding dimension.
        key: how a step maps to its state.
        eps: smoothing of both priors' logs.
        device: where the tensors live (CUDA when present by default).
    """

    def __init__(self, n_tools: int, dim: int, key: StateKey = StateKey(), eps: float = 1e-6,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        self.n_tools, self.dim, self.key, self.eps = n_tools, dim, key, eps
        self.device = torch.device(device)
        self.dtype = dtype
        self.nodes: dict[tuple[str, ...], int] = {}
        self.node_states: list[tuple[str, ...]] = []
        self.indptr = torch.zeros(1, dtype=torch.long, device=self.device)              # [U+1]
        self.edge_tool = torch.zeros(0, dtype=torch.long, device=self.device)           # [E]
        self.edge_count = torch.zeros(0, dtype=torch.long, device=self.device)          # [E]
        self.edge_sum = torch.zeros(0, dim, dtype=dtype, device=self.device)            # [E, d]
        self.edge_memory = torch.zeros(0, dim, dtype=dtype, device=self.device)         # [E, d]
        self.node_count = torch.zeros(0, dtype=torch.long, device=self.device)          # [U]
        self.node_depth = torch.zeros(0, dtype=torch.long, device=self.device)          # [U]

    # ---- building --------------------------------------------------------------------------------
    def _node_ids(self, states: Iterable[tuple[str, ...]], create: bool) -> list[int]:
        ids = []
        for s in states:
            u = self.nodes.get(s)
            if u is None:
                if not create:
                    ids.append(-1)
                    continue
                u = self.nodes[s] = len(self.node_states)
                self.node_states.append(s)
            ids.append(u)
        return ids

    def update(self, states: Sequence[tuple[str, ...]], tools: torch.Tensor, contexts: torch.Tensor) -> ExecutionTrie:
        """Add steps: ``states`` (len S), ``tools [S]`` gold registry ids, ``contexts [S, d]`` normalised.

        Existing edges keep their counts and sums; new states and edges are merged in sorted
        (node, tool) order, so the CSR layout stays valid.
        """
        if len(states) != len(tools) or len(states) != contexts.shape[0]:
            raise ValueError(f"update needs one tool and one context per state: {len(states)}, {len(tools)}, "
                             f"{contexts.shape[0]}")
        node = torch.tensor(self._node_ids(states, create=True), dtype=torch.long, device=self.device)  # [S]
        tools = tools.to(self.device, torch.long)
        ctx = contexts.to(self.device, self.dtype)
        n_nodes = len(self.node_states)
        old_node = torch.repeat_interleave(torch.arange(len(self.indptr) - 1, device=self.device),
                                           self.indptr.diff())  # [E_old]
        key = torch.cat([old_node * self.n_tools + self.edge_tool, node * self.n_tools + tools])  # [E_old+S]
        weight = torch.cat([self.edge_count, torch.ones_like(node)])
        vec = torch.cat([self.edge_sum, ctx])
        uniq, inv = torch.unique(key, sorted=True, return_inverse=True)  # [E], [E_old+S]
        self.edge_count = torch.zeros(len(uniq), dtype=torch.long, device=self.device).index_add_(0, inv, weight)
        self.edge_sum = torch.zeros(len(uniq), self.dim, dtype=self.dtype, device=self.device).index_add_(0, inv, vec)
        self.edge_tool = uniq % self.n_tools
        edge_node = uniq // self.n_tools
        self.indptr = torch.zeros(n_nodes + 1, dtype=torch.long, device=self.device)
        self.indptr[1:] = torch.bincount(edge_node, minlength=n_nodes).cumsum(0)
        self.node_count = torch.zeros(n_nodes, dtype=torch.long, device=self.device).index_add_(
            0, edge_node, self.edge_count)
        self.node_depth = torch.tensor([len(s) for s in self.node_states], dtype=torch.long, device=self.device)
        # The memory is the mean context; renormalising it makes the dot product a cosine.
        self.edge_memory = torch.nn.functional.normalize(self.edge_sum, dim=1)
        return self

    @classmethod
    def build(cls, steps: Sequence[Step], tool_ids: torch.Tensor, contexts: torch.Tensor, n_tools: int,
              key: StateKey = StateKey(), eps: float = 1e-6, device: str | torch.device = "cpu") -> ExecutionTrie:
        trie = cls(n_tools, contexts.shape[1], key, eps, device)
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

    def gather(self, node: torch.Tensor, contexts: torch.Tensor, chunk: int = 1024) -> ChildBatch:
        """Children, priors and similarities for nodes ``[B]`` and contexts ``[B, d]``."""
        node = node.to(self.device)
        ctx = contexts.to(self.device, self.dtype)
        seen = node >= 0
        safe = node.clamp_min(0)
        start = torch.where(seen, self.indptr[safe], torch.zeros_like(node))          # [B]
        n_child = torch.where(seen, self.indptr[safe + 1] - self.indptr[safe], torch.zeros_like(node))  # [B]
        width = max(int(n_child.max()) if len(node) else 0, 1)
        offs = torch.arange(width, device=self.device)                                  # [C]
        mask = offs[None, :] < n_child[:, None]                                         # [B, C]
        edge = torch.where(mask, start[:, None] + offs[None, :], torch.zeros_like(mask, dtype=torch.long))  # [B, C]
        tool = torch.where(mask, self.edge_tool[edge] if self.n_edges else edge, 0)
        count = torch.where(mask, self.edge_count[edge] if self.n_edges else edge, 0)
        node_count = torch.where(seen, self.node_count[safe] if self.n_nodes else node, 0)  # [B]
        neg_inf = torch.tensor(float("-inf"), device=self.device, dtype=self.dtype)
        log_p = torch.where(mask, torch.log(count / node_count.clamp_min(1)[:, None] + self.eps), neg_inf)
        sim = torch.empty(mask.shape, dtype=self.dtype, device=self.device)
        for lo in range(0, len(node), chunk):  # bound the [b, C, d] gather
            hi = lo + chunk
            mem = self.edge_memory[edge[lo:hi]] if self.n_edges else torch.zeros(*edge[lo:hi].shape, self.dim)
            sim[lo:hi] = torch.einsum("bcd,bd->bc", mem, ctx[lo:hi])                    # [b, C]
        sim = torch.where(mask, sim, neg_inf)
        log_l = contextual_prior(sim, mask, self.eps)
        depth = torch.where(seen, self.node_depth[safe] if self.n_nodes else node, -1)
        return ChildBatch(node=node, tool=tool, mask=mask, count=count, node_count=node_count, log_p=log_p,
                          sim=sim, log_l=log_l, depth=depth)

    # ---- persistence -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "config": {"n_tools": self.n_tools, "dim": self.dim, "key": asdict(self.key), "eps": self.eps},
            "node_states": [list(s) for s in self.node_states],
            "indptr": self.indptr.cpu(), "edge_tool": self.edge_tool.cpu(), "edge_count": self.edge_count.cpu(),
            "edge_sum": self.edge_sum.cpu(),
        }

    @classmethod
    def from_state_dict(cls, sd: dict, device: str | torch.device = "cpu") -> ExecutionTrie:
        c = sd["config"]
        trie = cls(c["n_tools"], c["dim"], StateKey(**c["key"]), c["eps"], device)
        trie.node_states = [tuple(s) for s in sd["node_states"]]
        trie.nodes = {s: i for i, s in enumerate(trie.node_states)}
        trie.indptr = sd["indptr"].to(trie.device)
        trie.edge_tool = sd["edge_tool"].to(trie.device)
        trie.edge_count = sd["edge_count"].to(trie.device)
        trie.edge_sum = sd["edge_sum"].to(trie.device)
        edge_node = torch.repeat_interleave(torch.arange(trie.n_nodes, device=trie.device), trie.indptr.diff())
        trie.node_count = torch.zeros(trie.n_nodes, dtype=torch.long, device=trie.device).index_add_(
            0, edge_node, trie.edge_count)
        trie.node_depth = torch.tensor([len(s) for s in trie.node_states], dtype=torch.long, device=trie.device)
        trie.edge_memory = torch.nn.functional.normalize(trie.edge_sum, dim=1)
        return trie

    def nbytes(self) -> int:
        ts = (self.indptr, self.edge_tool, self.edge_count, self.edge_sum, self.edge_memory, self.node_count,
              self.node_depth)
        return sum(t.element_size() * t.nelement() for t in ts)


def contextual_prior(sim: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """L = log(relu(sim) / sum_children relu(sim) + eps), uniform over the children if every sim <= 0.

    ``sim [B, C]``, ``mask [B, C]`` -> ``[B, C]`` with -inf where masked.
    """
    pos = torch.where(mask, sim.clamp_min(0), torch.zeros_like(sim))    # [B, C]
    total = pos.sum(1, keepdim=True)                                    # [B, 1]
    n = mask.sum(1, keepdim=True).clamp_min(1)
    prob = torch.where(total > 0, pos / total.clamp_min(1e-30), mask.to(sim.dtype) / n)
    return torch.where(mask, torch.log(prob + eps), torch.full_like(sim, float("-inf")))
