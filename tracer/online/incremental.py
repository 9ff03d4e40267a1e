"""Incremental updates of a fitted scorer, equal to a rebuild on the union: logged trajectories added to its
tries, tools added and renamed. When they run, and when the learned weights are refitted, is
:class:`tracer.online.updater.Updater`'s.

:func:`update_scorer` adds the successful steps of new trajectories to every trie a scorer holds
(the paper's trie, tracer_plus's one trie per key, ToolNet's and AutoTool's transition tries):
counts, both priors and edge memories are updated through :meth:`ExecutionTrie.update`, so the
result is a rebuild from scratch on the union of the old and new trajectories, in arrival order:

- node tables, CSR layout, edge tools, counts and empirical priors are equal **bit for bit**;
- edge memories are equal to float32 rounding (``atol 1e-6`` in the tests): the trie keeps the
  normalised mean and the norm of the sum, not the ``[E, d]`` sums themselves (half the memory of a
  large index), so an update recovers each old sum as ``memory * norm``, which rounds.

The learned parts (the blend head, the candidate model) are not touched here; :mod:`tracer.online.updater`
refits them on a schedule. New tools are registered with :func:`grow_resources` (registry and FAISS
fallback vectors; equal to building both on the union); a renamed tool keeps its trie edges
(:func:`rename_resources`, :func:`rename_in_trie`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from tracer.core.types import Registry, Tool, Trajectory
from tracer.encode.embedders import tool_rows
from tracer.memory.host_rows import host_view, to_host
from tracer.memory.priors import empirical_prior_np
from tracer.memory.transitions import TransitionTable
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.protocol import Scorer
from tracer.scorer_base.resources import Resources, training_steps
from tracer.scorer_base.single_step import rows_rewritten


def grow_resources(res: Resources, tools: Sequence[Tool]) -> Resources:
    """Resources whose registry and tool index end with the tools not yet registered (in the given order).

    Existing ids do not move, so tries and learned weights stay valid. Returns ``res`` itself when
    nothing is new; otherwise new objects (the old ones keep serving until the caller swaps them in).
    """
    fresh: dict[str, Tool] = {}
    for t in tools:
        if t.name not in res.registry and t.name not in fresh:
            fresh[t.name] = t
    if not fresh:
        return res
    vecs = tool_rows(res.embedder, list(fresh.values()))                                 # [M, d]
    return dataclasses.replace(res, registry=res.registry.extend(fresh.values()),
                               tool_index=res.tool_index.with_rows(list(fresh), vecs))


def rename_resources(res: Resources, old: str, new: str) -> Resources:
    """Resources where tool ``old`` is called ``new`` (same id, same description, masked if it was; its vector
    re-embedded, since the name is part of the text the fallback embeds)."""
    if old not in res.registry:
        raise KeyError(f"cannot rename {old!r}: no such tool in the registry")
    if new in res.registry:
        raise ValueError(f"cannot rename {old!r} to {new!r}: a tool of that name exists")
    i = res.registry.id(old)
    tool = dataclasses.replace(res.registry[i], name=new)
    vec = tool_rows(res.embedder, [tool])[0]                                             # [d]
    tools = list(res.registry)
    tools[i] = tool
    return dataclasses.replace(res, registry=Registry(tools),
                               removed=frozenset(new if n == old else n for n in res.removed),
                               tool_index=res.tool_index.with_rows(replace={i: (new, vec.cpu().numpy())}))


def rename_in_trie(trie: TransitionTable, old: str, new: str) -> None:
    """Rename a tool inside the states of a trie (the node table maps call-name tuples to nodes).
    The caller checks first that no state holds ``new`` (:func:`rename_scorer`)."""
    for u, s in enumerate(trie.node_states):
        if old in s:
            del trie.nodes[s]
            s = tuple(new if name == old else name for name in s)
            trie.node_states[u] = s
            trie.nodes[s] = u


def add_steps(trie: ExecutionTrie, states: Sequence[tuple[str, ...]], tools: torch.Tensor,
              contexts: torch.Tensor) -> np.ndarray:
    """Add steps to a trie and return the node of each step's state (``[S]`` int64): in place when every
    (state, tool) edge exists already and the trie is on the CPU (the steady state of a served index: the
    touched edges' counts and sums, their nodes' counts and empirical priors, in O(steps x d + touched
    children)), else :meth:`ExecutionTrie.update` (a sorted merge, O(E x d); on an accelerator that is a
    device copy).

    Both give the touched edges the same numbers up to float32 rounding (old sum recovered as
    ``memory * norm``, the new contexts summed in arrival order, added, renormalised; the norm is a
    float32 einsum here, torch's ``vector_norm`` in the merge) and leave untouched edges as
    they were; counts and priors are equal bit for bit. The in-place arithmetic is numpy on views of
    the trie's tensors: a BFCL trajectory touches a few rows, and some thirty torch ops of ~5-10 µs
    dispatch each would cost more than the update (:mod:`tracer.memory.host_rows`).
    """
    u = trie._node_ids(states, create=False)
    views = [host_view(t) for t in (trie.indptr, trie.edge_tool, trie.edge_count, trie.node_count,
                                    trie.edge_log_p, trie.edge_memory, trie.edge_norm)]
    if not states or min(u) < 0 or any(v is None for v in views):
        return _merge(trie, states, tools, contexts)
    if contexts.ndim != 2 or contexts.shape[1] != trie.dim:
        raise ValueError(f"contexts must be [S, {trie.dim}], got {tuple(contexts.shape)}")
    indptr, edge_tool, edge_count, node_count, edge_log_p, edge_memory, edge_norm = views
    node = np.asarray(u, dtype=np.int64)                                                # [S]
    key = node * trie.n_tools + to_host(tools)                                          # [S] (node, tool)
    nodes = np.unique(node)                                                              # [V] touched nodes
    # children per node
    width = indptr[nodes + 1] - indptr[nodes]                                            # [V]
    rows = (np.repeat(indptr[nodes] - np.cumsum(width) + width, width)
            + np.arange(int(width.sum())))                                               # [R] their edges
    row_key = np.repeat(nodes, width) * trie.n_tools + edge_tool[rows]                   # [R] ascending
    at = np.minimum(np.searchsorted(row_key, key), len(rows) - 1)                        # [S]
    if not len(rows) or (row_key[at] != key).any():
        return _merge(trie, states, tools, contexts)                                    # a new edge
    edge = rows[at]                                                                      # [S]
    touched = np.unique(edge)                                                            # [K]
    inv = np.searchsorted(touched, edge)                                                 # [S]
    ctx = to_host(contexts)
    new_sum = np.zeros((len(touched), trie.dim), dtype=np.float32)                      # [K, d]
    # each edge taken once (the usual case of one trajectory): nothing to add up
    if len(touched) == len(edge):
        new_sum[inv] = ctx
    else:
        for i, k in enumerate(inv.tolist()):  # in arrival order; a few steps: cheaper than np.add.at on rows
            new_sum[k] += ctx[i]
    total = edge_memory[touched].astype(np.float32, copy=False) * edge_norm[touched, None] + new_sum  # [K, d]
    norm = np.sqrt(np.einsum("kd,kd->k", total, total))                                 # [K] float32
    edge_memory[touched] = total / np.maximum(norm, np.float32(1e-12))[:, None]
    edge_norm[touched] = norm
    edge_count[touched] += np.bincount(inv)
    node_count[nodes] += np.bincount(np.searchsorted(nodes, node))
    edge_log_p[rows] = empirical_prior_np(edge_count[rows], np.repeat(node_count[nodes], width), trie.eps)
    rows_rewritten(trie, nodes, rows)  # the live path's cache stays, patched (not rebuilt on the next step)
    return node


def _merge(trie: ExecutionTrie, states: Sequence[tuple[str, ...]], tools: torch.Tensor,
           contexts: torch.Tensor) -> np.ndarray:
    trie.update(states, tools, contexts)
    return np.asarray(trie._node_ids(states, create=False), dtype=np.int64)


def scorer_tries(scorer: Scorer) -> list[TransitionTable]:
    """Every trie or transition table a fitted scorer holds (empty for scorers without one, e.g. vector
    search)."""
    return scorer.memory_tables()


def update_scorer(scorer: Scorer, trajectories: Sequence[Trajectory], res: Resources | None = None) -> int:
    """Add the trajectories' steps to every trie of a fitted scorer, over ``res`` (default: the
    scorer's; pass :func:`grow_resources`' result to register new tools). Returns the steps added.

    The tries are updated in place; then the scorer is re-attached to them and to ``res``: tracer_plus
    recomputes only the entries of its tables the new steps touched (:meth:`PlusIndex.updated`), the
    tracer family rebuilds Tracer+G's global set.
    """
    res = scorer.res if res is None else res
    if scorer.res is None:
        raise RuntimeError(f"scorer {scorer.name!r} is not fitted: fit or load it before updating it")
    if not scorer.updatable:  # a cascade: two stages over two encoders, and a gate calibrated on their fit
        raise TypeError(f"scorer {scorer.name!r}: a cascade is not updated in place (Retriever.update); "
                        f"refit it on the logs so far "
                        f"(Retriever.from_dataset(..., scorer='cascade', encoder_training='cascade'))")
    if res.registry is not scorer.res.registry and (len(res.registry) < len(scorer.res.registry) or any(
            a.name != b.name for a, b in zip(res.registry, scorer.res.registry))):
        raise ValueError("the new registry must extend the scorer's "
                         "(same tools, same order, new ones at the end)")
    steps = training_steps(trajectories, res.registry, scorer.successful_only)
    tries = scorer_tries(scorer)
    nodes = []  # per trie: the nodes the new steps reached (what tracer_plus's tables recompute)
    gold = res.tool_ids([s.gold for s in steps])                                       # [S]
    if tries:
        # None: counts only
        ctx = scorer.memory_contexts(steps, res)                                        # [S, d]
        for trie in tries:
            trie.n_tools = len(res.registry)  # ids are registry positions: appended tools take the new ones
            states = [trie.key.state(s) for s in steps]
            if isinstance(trie, ExecutionTrie):
                nodes.append(add_steps(trie, states, gold, ctx))
            else:
                trie.add(states, gold)
    scorer.reattach(tries, res, touched=(nodes, gold.numpy()))
    return len(steps)


def rename_scorer(scorer: Scorer, old: str, new: str) -> None:
    """Rename a tool in a fitted scorer: registry, fallback vector and every trie's states."""
    res = rename_resources(scorer.res, old, new)
    tries = scorer_tries(scorer)
    if any(new in s for trie in tries for s in trie.node_states):  # logs called an unregistered tool so named
        raise ValueError(f"cannot rename {old!r} to {new!r}: trie states already hold {new!r}")
    for trie in tries:
        rename_in_trie(trie, old, new)
    scorer.reattach(tries, res)
