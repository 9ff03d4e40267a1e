"""Cost of learning while serving: adding trajectories to a fitted index, and refitting the learned parts.

    nice -n 10 python -m benchmarks.bench_update                      # BFCL, then the 100k scale corpus
    nice -n 10 python -m benchmarks.bench_update --scale 1000000      # the 1M corpus of bench_scale.py

BFCL (fold 0's training split): the scorer is fitted on all but the last ``--add`` trajectories of
a seeded arrival order, which are then added through :func:`tracer.online.incremental.update_scorer` one at a
time and in batches of 10 and 100. Contexts come from an embedding cache that holds them already
(a deterministic text-hash encoder stands in for MiniLM, whose ~5-20 ms per context on this CPU is
the embedding's cost, not the update's): what is timed is rendering, cache lookups, every trie's
update (in place when all edges exist, else the sorted merge) and re-attaching (tracer_plus's
tables, updated where the steps touched them). Each row also gives the share of calls done in place
and their cost alone (a call that adds an edge merges, O(E x d)). Refit: the seconds one
:meth:`tracer.online.updater.Updater.refit` takes on the whole split.

Scale (``benchmarks/bench_scale.py``'s seeded chain over 10,000 tools, random unit contexts, d = 384,
prefix key): a trie built from ``--scale`` trajectories, then fresh trajectories added in batches of
1, 10, 100 and 1,000 through :func:`tracer.online.incremental.add_steps`.

Times are thread CPU time (one torch thread). Prints a Markdown table and the command.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import torch

from benchmarks.synthetic import Chain, step_states, unit_rows
from tracer.build import build_scorer
from tracer.core.folds import kfold
from tracer.encode.embedders import CachedEmbedder
from tracer.online.incremental import add_steps, update_scorer
from tracer.online.updater import Updater
from tracer.scorer_base.resources import Resources, training_steps


class HashEncoder:
    """A deterministic unit vector per text (seeded by its hash): the embedding cache's stand-in."""

    name, dim = "hash-unit-384", 384

    def encode(self, texts):
        rows = [np.random.default_rng(abs(hash(t)) % (1 << 63)).standard_normal(self.dim) for t in texts]
        return torch.nn.functional.normalize(
            torch.from_numpy(np.asarray(rows, np.float32).reshape(-1, self.dim)), dim=1)


def timed(fn, *args) -> float:
    t0 = time.thread_time_ns()
    fn(*args)
    return (time.thread_time_ns() - t0) / 1e3                                            # µs


def in_place_stats(calls: list[tuple[float, int, bool]]) -> dict:
    """Share of update calls done in place (no edge added, so no merge) and their µs per trajectory."""
    placed = [(us, n) for us, n, ok in calls if ok]
    return {"in_place": len(placed) / len(calls),
            "us_per_traj_in_place":
                sum(us for us, _ in placed) / sum(n for _, n in placed) if placed else None}


def bfcl_rows(args) -> list[dict]:
    from tracer.data import load_dataset

    ds = load_dataset("bfcl", execute=False)
    train = list(kfold(ds.trajectories, 5, args.seed)[0].train)
    random.Random(args.seed).shuffle(train)
    base, new = train[:-args.add], train[-args.add:]
    emb = CachedEmbedder(HashEncoder())
    res = Resources.build(ds.registry, emb, device="cpu", seed=args.seed)
    rows = []
    for name in ("tracer_fixed", "tracer_plus"):
        probe = build_scorer(name)
        steps = training_steps(train, ds.registry)
        for rendering in {getattr(probe, a) for a in ("rendering", "memory_rendering", "query_rendering")
                          if hasattr(probe, a)}:
            res.embed(steps, rendering)                                                  # warm the cache
        for batch in (1, 10, 100):
            scorer = build_scorer(name, head={"max_epochs": 1})
            scorer.fit(base, res)
            tries = scorer.tries if name == "tracer_plus" else [scorer.trie]
            calls = []  # (µs, trajectories, every trie updated in place)
            for lo in range(0, len(new), batch):
                ptrs = [t.edge_memory.data_ptr() for t in tries]
                us = timed(update_scorer, scorer, new[lo:lo + batch])
                calls.append((us, len(new[lo:lo + batch]),
                              all(t.edge_memory.data_ptr() == p for t, p in zip(tries, ptrs))))
            us = sum(c[0] for c in calls)
            n_steps = len(training_steps(new, ds.registry))
            rows.append({"corpus": "BFCL", "scorer": name, "base": len(base), "batch": batch,
                         "us_per_traj": us / len(new), "us_per_step": us / n_steps, **in_place_stats(calls),
                         "edges": sum(t.n_edges for t in tries)})
            print(rows[-1], file=sys.stderr, flush=True)
    for name in ("tracer", "tracer_plus"):
        scorer = build_scorer(name, head={"max_epochs": 1})
        scorer.fit(base[:20], res)
        up = Updater(scorer, history=train)
        t0 = time.perf_counter()
        up.refit(wait=True)
        rows.append({"corpus": "BFCL", "scorer": name, "refit_s": time.perf_counter() - t0,
                     "base": len(train)})
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def scale_rows(args) -> list[dict]:
    from tracer.memory.trie import ExecutionTrie

    chain = Chain(args.tools, args.seed)
    names = [f"tool_{i:05d}" for i in range(args.tools)]
    rng = np.random.default_rng(args.seed + args.scale)
    gen = torch.Generator().manual_seed(args.seed)
    trie = ExecutionTrie(args.tools, args.dim)
    t0 = time.perf_counter()
    for lo in range(0, args.scale, 200_000):
        states, gold = step_states(*chain.turns(min(200_000, args.scale - lo), rng), names)
        trie.update(states, torch.from_numpy(gold), unit_rows(len(states), args.dim, gen))
    print(f"built {args.scale:,} trajectories, {trie.n_edges:,} edges in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr, flush=True)
    rows = []
    for batch in (1, 10, 100, 1000):
        n_calls = max(2, min(args.calls, 4000 // batch))
        calls, n_steps = [], 0
        for _ in range(n_calls):
            states, gold = step_states(*chain.turns(batch, rng), names)
            ctx = unit_rows(len(states), args.dim, gen)
            ptr = trie.edge_memory.data_ptr()
            calls.append((timed(add_steps, trie, states, torch.from_numpy(gold), ctx), batch,
                          trie.edge_memory.data_ptr() == ptr))
            n_steps += len(states)
        us = sum(c[0] for c in calls)
        rows.append({"corpus": f"scale {args.scale:,}", "scorer": "tracer (prefix trie)", "base": args.scale,
                     "batch": batch, "us_per_traj": us / (n_calls * batch), "us_per_step": us / n_steps,
                     **in_place_stats(calls), "edges": trie.n_edges})
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--add", type=int, default=200, help="BFCL trajectories added after the fit")
    ap.add_argument("--scale", type=int, default=100_000,
                    help="trajectories of the synthetic corpus (0: skip)")
    ap.add_argument("--calls", type=int, default=20,
                    help="update calls timed per batch size on the scale corpus")
    ap.add_argument("--tools", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-bfcl", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = ([] if args.skip_bfcl else bfcl_rows(args)) + (scale_rows(args) if args.scale else [])
    print("| corpus | scorer | trajectories in the index | batch | µs / trajectory | µs / step | edges | "
          "calls in place | µs / trajectory, calls in place |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "batch" in r:
            ip = "–" if r["us_per_traj_in_place"] is None else f"{r['us_per_traj_in_place']:,.0f}"
            print(f"| {r['corpus']} | {r['scorer']} | {r['base']:,} | {r['batch']} | {r['us_per_traj']:,.0f} "
                  f"| {r['us_per_step']:,.0f} | {r['edges']:,} | {r['in_place']:.0%} | {ip} |")
    print("\n| refit (BFCL fold 0's training split) | trajectories | seconds |\n|---|---:|---:|")
    for r in rows:
        if "refit_s" in r:
            print(f"| {r['scorer']} | {r['base']:,} | {r['refit_s']:.1f} |")
    print(f"\nLoad average: {os.getloadavg()[0]:.1f}. "
          f"Command: `python -m benchmarks.bench_update {' '.join(sys.argv[1:])}`")


if __name__ == "__main__":
    main()
