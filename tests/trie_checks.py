"""Two scorers' tries compared (the online tests: an update, a refit or the ``tracer update`` CLI equals a
batch build on the union): node tables, CSR layout, counts and priors bit for bit, edge memories to float32
rounding."""

from __future__ import annotations

import torch

from tracer.memory.trie import ExecutionTrie
from tracer.online.incremental import scorer_tries


def assert_same_tries(a, b, atol=1e-6):
    """Node tables, CSR layout, counts and priors bit for bit; edge memories to float32 rounding."""
    ta, tb = scorer_tries(a), scorer_tries(b)
    assert len(ta) == len(tb) and ta
    for x, y in zip(ta, tb):
        assert x.node_states == y.node_states and x.nodes == y.nodes and x.n_tools == y.n_tools
        for f in ("indptr", "edge_tool", "edge_count", "node_count", "node_depth"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f
        if isinstance(x, ExecutionTrie):  # transition tables (ToolNet, AutoTool) hold counts only
            assert torch.equal(x.edge_log_p, y.edge_log_p)
            torch.testing.assert_close(x.edge_memory, y.edge_memory, atol=atol, rtol=0)
            torch.testing.assert_close(x.edge_norm, y.edge_norm, atol=atol * 10, rtol=1e-6)
