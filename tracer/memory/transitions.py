"""Transition counts N(S, t) between states and next tools, without contexts or edge memories.

ToolNet, AutoTool and H-EPM need only how often each tool followed each state. The table keeps the
execution trie's layout (:mod:`tracer.memory.trie` extends it with priors and edge memories): a
hash map from the state tuple to a node id (ids in order of first appearance), and edges sorted by
(node, tool) stored CSR-like, so the children of node ``u`` are rows ``indptr[u]:indptr[u+1]`` of
``edge_tool [E]`` and ``edge_count [E]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from tracer.core.types import Step
from tracer.memory.keys import PREFIX, StateKey


@dataclass
class Transitions:
    """The children of a batch of states, padded to the widest node in the batch (B steps, C children)."""

    node: torch.Tensor        # [B] node id, -1 for an unseen state
    tool: torch.Tensor        # [B, C] registry id of each child (0 where masked)
    mask: torch.Tensor        # [B, C] True for a real child
    count: torch.Tensor       # [B, C] N(S, t)
    node_count: torch.Tensor  # [B] N(S)
    depth: torch.Tensor       # [B] length of the state (-1 when unseen)

    @property
    def n_children(self) -> torch.Tensor:  # [B]
        return self.mask.sum(1)


class TransitionTable:
    """Nodes (states under ``key``) and CSR edges with their counts. Build with :meth:`build`.

    Args:
        n_tools: registry size (tool ids are registry positions).
        key: how a step maps to its state.
        device: where the tensors live.
    """

    def __init__(self, n_tools: int, key: StateKey = PREFIX, device: str | torch.device = "cpu"):
        self.n_tools, self.key = n_tools, key
        self.device = torch.device(device)
        self.nodes: dict[tuple[str, ...], int] = {}
        self.node_states: list[tuple[str, ...]] = []
        long = {"dtype": torch.long, "device": self.device}
        self.indptr = torch.zeros(1, **long)                                           # [U+1]
        self.edge_tool = torch.zeros(0, **long)                                        # [E]
        self.edge_count = torch.zeros(0, **long)                                       # [E]
        self.node_count = torch.zeros(0, **long)                                       # [U]
        self.node_depth = torch.zeros(0, **long)                                       # [U]

    @classmethod
    def build(cls, steps: Sequence[Step], tool_ids: torch.Tensor, n_tools: int, key: StateKey = PREFIX,
              device: str | torch.device = "cpu") -> TransitionTable:
        """The counts of ``steps`` (their gold registry ids ``tool_ids [S]``) under ``key``."""
        table = cls(n_tools, key, device)
        return table.add([key.state(s) for s in steps], tool_ids)

    def add(self, states: Sequence[tuple[str, ...]], tools: torch.Tensor) -> TransitionTable:
        """Count more transitions: ``states`` (len S) and ``tools [S]`` registry ids."""
        if len(states) != len(tools):
            raise ValueError(f"add needs one tool per state: {len(states)} states, {len(tools)} tools")
        tools = tools.to(self.device, torch.long)
        n_old_nodes = self.n_nodes
        node = torch.tensor(self._node_ids(states, create=True), dtype=torch.long, device=self.device)  # [S]
        new_key, new_count = torch.unique(node * self.n_tools + tools, sorted=True, return_counts=True)  # [K]
        old_key = self.edge_node() * self.n_tools + self.edge_tool                                   # [E_old]
        key = torch.unique(torch.cat([old_key, new_key]), sorted=True)                                # [E]
        count = torch.zeros(len(key), dtype=torch.long, device=self.device)
        count[torch.searchsorted(key, old_key)] = self.edge_count
        count.index_add_(0, torch.searchsorted(key, new_key), new_count)
        self._set_edges(key, count, n_old_nodes)
        return self

    def _set_edges(self, key: torch.Tensor, count: torch.Tensor, n_old_nodes: int) -> torch.Tensor:
        """Store edges ``key = node * n_tools + tool [E]`` (sorted) with counts ``[E]``; return their nodes
        ``[E]``."""
        n_nodes = self.n_nodes
        self.edge_count = count
        self.edge_tool = key % self.n_tools
        edge_node = key // self.n_tools
        self.indptr = torch.zeros(n_nodes + 1, dtype=torch.long, device=self.device)
        self.indptr[1:] = torch.bincount(edge_node, minlength=n_nodes).cumsum(0)
        self.node_count = torch.zeros(n_nodes, dtype=torch.long, device=self.device).index_add_(
            0, edge_node, count)
        new_depth = torch.tensor([len(s) for s in self.node_states[n_old_nodes:]], dtype=torch.long,
                                 device=self.device)
        self.node_depth = torch.cat([self.node_depth, new_depth])
        return edge_node

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

    # ---- queries ---------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return len(self.node_states)

    @property
    def n_edges(self) -> int:
        return int(self.edge_tool.shape[0])

    def edge_node(self) -> torch.Tensor:
        """The source node of every edge, ``[E]``."""
        return torch.repeat_interleave(torch.arange(len(self.indptr) - 1, device=self.device),
                                       self.indptr.diff())

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
        return torch.tensor(self._node_ids((self.key.state(s) for s in steps), create=False),
                            dtype=torch.long, device=self.device)

    def slots(self, node: torch.Tensor) -> tuple[Transitions, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The children of nodes ``[B]``: (:class:`Transitions`, first edge ``[B]``, number of children
        ``[B]``, edge index ``[B, C]`` (0 where masked))."""
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
        else:
            tool = count = torch.zeros_like(edge)
        node_count = torch.where(seen, self.node_count[safe], 0) if self.n_nodes else torch.zeros_like(node)
        depth = torch.where(seen, self.node_depth[safe], -1) if self.n_nodes else torch.full_like(node, -1)
        return Transitions(node, tool, mask, count, node_count, depth), start, n_child, edge

    def gather(self, node: torch.Tensor) -> Transitions:
        """The children of nodes ``[B]`` with their counts."""
        return self.slots(node)[0]
