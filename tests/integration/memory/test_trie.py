"""The execution trie against exact references: a naive scan over training turns, hand computations,
and its own batched path (the single-step path must agree bit for bit)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from builders import call

from tracer.core.steps import extract_all, turns_of
from tracer.core.types import Registry, Tool, Trajectory
from tracer.memory.keys import StateKey
from tracer.memory.priors import contextual_prior
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.resources import training_steps
from tracer.scorer_base.single_step import children_one, contextual_prior_one

EPS = 1e-6


@pytest.fixture(scope="module")
def bfcl():
    from tracer.data import load_dataset

    return load_dataset("bfcl", execute=False)


def unit_rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)),
                                         dim=1)


def bfcl_trie(bfcl, key: StateKey | None = None, d: int = 16):
    key = key or StateKey()
    steps = training_steps(bfcl.trajectories, bfcl.registry)
    ids = torch.tensor([bfcl.registry.id(s.gold) for s in steps])
    ctx = unit_rows(len(steps), d)
    return ExecutionTrie.build(steps, ids, ctx, len(bfcl.registry), key, EPS), steps, ids, ctx


# ---- structure against a naive scan ------------------------------------------------------------------
def test_children_and_counts_match_a_naive_scan_over_training_turns(bfcl):
    trie, *_ = bfcl_trie(bfcl)
    naive: dict[tuple[str, ...], Counter] = defaultdict(Counter)
    for traj in bfcl.trajectories:
        if not traj.success:
            continue
        for turn in turns_of(traj):
            for i, name in enumerate(turn):
                if name in bfcl.registry:
                    naive[tuple(turn[:i])][bfcl.registry.id(name)] += 1
    assert set(trie.node_states) == set(naive)
    for state, counter in naive.items():
        assert trie.children(state) == dict(counter), state
        u = trie.node(state)
        assert int(trie.node_count[u]) == sum(counter.values())
        assert int(trie.node_depth[u]) == len(state)
    # CSR: children of a node are contiguous and sorted by tool id
    for u in range(trie.n_nodes):
        tools = trie.edge_tool[trie.indptr[u]:trie.indptr[u + 1]].tolist()
        assert tools == sorted(set(tools)) and tools
    assert trie.children(("no_such_tool",)) == {} and trie.node(("no_such_tool",)) == -1


def test_empirical_prior_is_log_of_count_share(bfcl):
    trie, *_ = bfcl_trie(bfcl)
    for u in (0, trie.n_nodes // 2, trie.n_nodes - 1):
        lo, hi = int(trie.indptr[u]), int(trie.indptr[u + 1])
        n = int(trie.node_count[u])
        want = [np.float32(math.log(c / n + EPS)) for c in trie.edge_count[lo:hi].tolist()]
        assert trie.edge_log_p[lo:hi].tolist() == want


def test_edge_memory_is_the_renormalised_mean_of_its_contexts(bfcl):
    trie, steps, ids, ctx = bfcl_trie(bfcl)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, s in enumerate(steps):
        groups[(tuple(s.prefix), int(ids[i]))].append(i)
    for (state, tool), rows in list(groups.items())[:60]:
        u = trie.node(state)
        lo = int(trie.indptr[u])
        e = lo + trie.edge_tool[lo:int(trie.indptr[u + 1])].tolist().index(tool)
        mean = ctx[rows].double().mean(0)
        torch.testing.assert_close(trie.edge_memory[e].double(), mean / mean.norm(), atol=2e-6, rtol=0)
        torch.testing.assert_close(trie.edge_norm[e].double(), ctx[rows].double().sum(0).norm(), atol=1e-4,
                                   rtol=1e-6)
        assert int(trie.edge_count[e]) == len(rows)


def test_update_in_chunks_equals_one_build(bfcl):
    one, steps, ids, ctx = bfcl_trie(bfcl)
    key = StateKey()
    chunked = ExecutionTrie(len(bfcl.registry), ctx.shape[1], key, EPS)
    for lo in range(0, len(steps), 1000):
        chunked.update([key.state(s) for s in steps[lo:lo + 1000]], ids[lo:lo + 1000], ctx[lo:lo + 1000])
    assert chunked.node_states == one.node_states
    for name in ("indptr", "edge_tool", "edge_count", "edge_log_p", "node_count", "node_depth"):
        assert torch.equal(getattr(chunked, name), getattr(one, name)), name
    torch.testing.assert_close(chunked.edge_memory, one.edge_memory, atol=1e-6, rtol=0)


def test_bad_updates_are_refused():
    trie = ExecutionTrie(3, 2)
    with pytest.raises(ValueError, match="one tool and one context"):
        trie.update([()], torch.tensor([0, 1]), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"\[S, 2\]"):
        trie.update([()], torch.tensor([0]), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="tool ids"):
        trie.update([("a",)], torch.tensor([3]), torch.ones(1, 2))
    assert trie.n_nodes == 0 and trie.n_edges == 0  # a refused update leaves the trie as it was


# ---- state keys on a hand-written two-turn conversation ---------------------------------------------
TWO_TURNS = Trajectory(id="two", group="two", domain="x", messages=(
    {"role": "user", "content": "first"}, call("a", 0), {"role": "tool", "tool_call_id": "c0", "content": ""},
    call("b", 1), {"role": "tool", "tool_call_id": "c1", "content": ""},
    {"role": "user", "content": "second"}, call("c", 2),
    {"role": "tool", "tool_call_id": "c2", "content": ""},
    call("d", 3), {"role": "tool", "tool_call_id": "c3", "content": ""},
))
ABCD = Registry(Tool(n) for n in "abcd")


@pytest.mark.parametrize("key, states", [
    (StateKey("prefix"), [(), ("a",), (), ("c",)]),
    (StateKey("prefix", cross_turn=True), [(), ("a",), ("a", "b"), ("a", "b", "c")]),
    (StateKey("last_n", n=1), [(), ("a",), (), ("c",)]),
    (StateKey("last_n", n=1, cross_turn=True), [(), ("a",), ("b",), ("c",)]),
    (StateKey("last_n", n=2, cross_turn=True), [(), ("a",), ("a", "b"), ("b", "c")]),
])
def test_state_keys_on_a_two_turn_conversation(key, states):
    steps = extract_all([TWO_TURNS])
    assert [s.gold for s in steps] == ["a", "b", "c", "d"]
    assert [key.state(s) for s in steps] == states
    trie = ExecutionTrie.build(steps, torch.tensor([0, 1, 2, 3]), unit_rows(4, 3), 4, key, EPS)
    want: dict[tuple, dict[int, int]] = defaultdict(dict)
    for state, tool in zip(states, range(4)):
        want[state][tool] = want[state].get(tool, 0) + 1
    assert {s: trie.children(s) for s in trie.node_states} == dict(want)


def test_state_key_rejects_bad_config():
    with pytest.raises(ValueError, match="prefix' or 'last_n"):
        StateKey("suffix")
    with pytest.raises(ValueError, match="n >= 1"):
        StateKey("last_n", n=0)


# ---- contextual prior by hand ------------------------------------------------------------------------
def three_edge_trie() -> ExecutionTrie:
    """One node (the root) with three children. Edge 0 saw contexts e0 and e1 (memory (e0+e1)/sqrt 2),
    edge 1 saw e1, edge 2 saw e2."""
    e = torch.eye(3)
    return ExecutionTrie(3, 3, StateKey(), EPS).update([(), (), (), ()], torch.tensor([0, 0, 1, 2]),
                                                       torch.stack([e[0], e[1], e[1], e[2]]))


@pytest.mark.parametrize("c, sims, probs", [
    # cos with m0 = (1,1,0)/sqrt2, m1 = (0,1,0), m2 = (0,0,1)
    ((0.6, 0.8, 0.0), (1.4 / math.sqrt(2), 0.8, 0.0), (1.4 / math.sqrt(2), 0.8, 0.0)),   # relu keeps two
    # every sim <= 0: uniform
    ((0.6, -0.8, 0.0), (-0.2 / math.sqrt(2), -0.8, 0.0), None),
    ((0.0, -0.6, 0.8), (-0.6 / math.sqrt(2), -0.6, 0.8), (0.0, 0.0, 0.8)),            # one positive
])
def test_contextual_prior_by_hand_on_three_edges(c, sims, probs):
    trie = three_edge_trie()
    assert trie.children(()) == {0: 2, 1: 1, 2: 1}
    ctx = torch.tensor([c])
    cb = trie.gather(torch.tensor([0]), ctx)
    torch.testing.assert_close(cb.sim[0].double(), torch.tensor(sims, dtype=torch.float64), atol=1e-6, rtol=0)
    if probs is None:
        want = [math.log(1 / 3 + EPS)] * 3
    else:
        total = sum(probs)
        want = [math.log(p / total + EPS) for p in probs]
    torch.testing.assert_close(cb.log_l[0].double(), torch.tensor(want, dtype=torch.float64), atol=1e-5,
                               rtol=0)
    assert cb.log_p[0].tolist() == [np.float32(math.log(x + EPS)) for x in (0.5, 0.25, 0.25)]
    one = children_one(trie, (), ctx[0].numpy())  # the same float32 context
    assert one.sim.tolist() == cb.sim[0].tolist() and one.log_l.tolist() == cb.log_l[0].tolist()


def test_contextual_prior_masks_and_matches_the_numpy_version():
    g = torch.Generator().manual_seed(1)
    sim = torch.randn(50, 7, generator=g)
    mask = torch.rand(50, 7, generator=g) < 0.7
    sim[:5] = -torch.rand(5, 7, generator=g)  # all <= 0 rows
    out = contextual_prior(torch.where(mask, sim, float("-inf")), mask, EPS)
    assert torch.isinf(out[~mask]).all()
    for i in range(50):
        assert out[i][mask[i]].tolist() == contextual_prior_one(sim[i][mask[i]].numpy(), EPS).tolist()


# ---- the batched and the single-step paths -----------------------------------------------------------
@pytest.mark.parametrize("key", [StateKey(), StateKey("last_n", n=2, cross_turn=True)])
def test_gather_and_children_one_agree_bit_for_bit(bfcl, key):
    trie, steps, _, _ = bfcl_trie(bfcl, key, d=32)
    queries = unit_rows(len(steps), 32, seed=5)
    nodes = trie.lookup(steps)
    cb = trie.gather(nodes, queries)
    assert cb.mask.any(1).all()  # the index holds every step it is queried with
    for heavy in (1, 10**9):  # every node by matmul / every (step, child) pair by dot product
        other = trie.gather(nodes, queries, heavy=heavy)
        assert torch.equal(other.sim, cb.sim) and torch.equal(other.log_l, cb.log_l)
    for i in range(0, len(steps), 7):
        one = children_one(trie, key.state(steps[i]), queries[i].numpy())
        m = cb.mask[i]
        assert one.node == int(cb.node[i])
        assert one.tool.tolist() == cb.tool[i][m].tolist() and one.count.tolist() == cb.count[i][m].tolist()
        assert one.log_p.tolist() == cb.log_p[i][m].tolist()
        assert one.sim.tolist() == cb.sim[i][m].tolist()
        assert one.log_l.tolist() == cb.log_l[i][m].tolist()


def test_gather_of_unseen_states_and_without_contexts():
    trie = three_edge_trie()
    cb = trie.gather(torch.tensor([-1, 0]), None)
    assert cb.mask.tolist() == [[False, False, False], [True, True, True]]
    assert cb.depth.tolist() == [-1, 0] and cb.node_count.tolist() == [0, 4]
    assert torch.isinf(cb.log_p[0]).all() and torch.isinf(cb.log_l[0]).all()
    uniform = np.float32(math.log(1 / 3 + EPS))
    assert cb.log_l[1].tolist() == [uniform] * 3  # no context: sims 0, uniform prior
    same = trie.gather(torch.tensor([-1, 0]), torch.zeros(2, 3))  # zero contexts: the cosines it skipped
    assert torch.equal(same.sim, cb.sim) and torch.equal(same.log_l, cb.log_l)
    with pytest.raises(ValueError, match=r"contexts must be \[B, 3\]"):
        trie.gather(torch.tensor([0]), torch.zeros(1, 1))
    empty = ExecutionTrie(3, 3).gather(torch.tensor([-1]), torch.zeros(1, 3))
    assert not empty.mask.any()
    assert children_one(trie, ("x",), np.zeros(3)).node == -1


def test_state_dict_round_trip_is_exact(bfcl):
    trie, *_ = bfcl_trie(bfcl, StateKey("prefix", cross_turn=True))
    again = ExecutionTrie.from_state_dict(trie.state_dict())
    assert again.node_states == trie.node_states and again.key == trie.key and again.eps == trie.eps
    for name in ("indptr", "edge_tool", "edge_count", "edge_log_p", "edge_memory", "edge_norm", "node_count",
                 "node_depth"):
        assert torch.equal(getattr(again, name), getattr(trie, name)), name
    assert trie.nbytes() == again.nbytes() > 0
