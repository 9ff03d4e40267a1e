"""Cost of the Tracer retriever on BFCL, beyond the context embedding.

    python -m benchmarks.bench_retriever                      # BFCL, tracer_fixed, 5 folds
    python -m benchmarks.bench_retriever --scorer tracer_g --repeats 5

What is measured (contexts are embedded once with MiniLM before any timing, through the disk cache
``.cache/embeddings``; the first run embeds BFCL's ~2,900 distinct contexts, minutes on 2 cores):

- build: steps extraction + trie, counts, priors and edge memories + Tracer+G's set + the FAISS
  tool index, for all BFCL trajectories, from precomputed embeddings;
- one step: ``select_one(step, (context,), k)`` from a Step and its context embedding to the presented
  registry ids, one call at a time, out of fold (the index holds the other 4 folds, so unseen
  prefixes take the fallback path). Also ``rank_one`` (the whole ranking) and the facade's path
  from a raw message list (``step_from_messages`` + ``select_one``). Wall clock and thread CPU
  time (the CPU time is what the step costs; the wall clock adds waiting on a shared machine);
- batched: ``finalize(score_embedded(fold steps, contexts), k)`` for each held-out fold, steps/s;
- embedding: MiniLM on one context, cold (not cached), and a cache hit;
- memory: the trie's tensors (bytes per edge and total), the Python node table, the tool index,
  the saved index on disk.

Prints a Markdown table; ``--json`` writes the numbers too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# one BLAS thread, set before numpy loads OpenBLAS: on a shared 2-core machine a second BLAS thread waits
# on a busy core and makes a 10k x 384 gemv ~5x slower
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import torch


def percentile(xs, q):
    return float(np.percentile(np.asarray(xs), q))


def deep_size(obj, seen=None) -> int:
    """Approximate bytes of a dict of tuples of str (the node table)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (tuple, list)):
        size += sum(deep_size(x, seen) for x in obj)
    return size


def time_calls(fn, items, repeats):
    wall, cpu = [], []
    for _ in range(repeats):
        for it in items:
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            fn(it)
            w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            wall.append((w1 - w0) / 1e3)
            cpu.append((c1 - c0) / 1e3)
    return wall, cpu


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scorer", default="tracer_fixed", choices=["tracer_fixed", "tracer_g"])
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3, help="passes over the held-out steps (single step)")
    ap.add_argument("--batch-repeats", type=int, default=5)
    ap.add_argument("--embed-samples", type=int, default=20,
                    help="contexts embedded cold for the embedding time")
    ap.add_argument("--cache-dir", default=".cache/embeddings")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: on a shared 2-core machine "
                         "OpenMP waits dominate small ops)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from tracer.build import build_embedder, build_scorer
    from tracer.core.folds import kfold
    from tracer.data import load_dataset
    from tracer.encode.embedders import CachedEmbedder
    from tracer.encode.index import ToolIndex
    from tracer.memory.trie import ExecutionTrie
    from tracer.retriever import step_from_messages
    from tracer.scorer_base.ranking import finalize
    from tracer.scorer_base.resources import Resources, training_steps

    ds = load_dataset("bfcl", execute=False)
    emb = build_embedder("minilm", cache_dir=args.cache_dir, device="cpu")
    scorer = build_scorer(args.scorer)
    rendering = scorer.rendering
    all_steps = training_steps(ds.trajectories, ds.registry)
    print(f"embedding {len(all_steps)} BFCL contexts (cached after the first run) ...", file=sys.stderr)
    t0 = time.perf_counter()
    tool_vecs = emb.encode([t.search_text for t in ds.registry])
    ctx_all = emb.encode([rendering.render(s.context) for s in all_steps])      # [S, d]
    t_embed = time.perf_counter() - t0
    ctx_of = {(s.trajectory_id, s.index): i for i, s in enumerate(all_steps)}

    # ---- build, all trajectories, beyond the embeddings -------------------------------------------
    builds = []
    for _ in range(3):
        t0 = time.perf_counter()
        steps = training_steps(ds.trajectories, ds.registry)
        ctx = ctx_all[[ctx_of[(s.trajectory_id, s.index)] for s in steps]]
        index = ToolIndex(ds.registry.names, tool_vecs)
        res = Resources(ds.registry, emb, index, "cpu")
        trie = ExecutionTrie.build(steps, res.tool_ids([s.gold for s in steps]), ctx, len(ds.registry),
                                   scorer.key, scorer.eps, "cpu")
        full = build_scorer(args.scorer).attach(trie, res)
        builds.append(time.perf_counter() - t0)
    t_build = min(builds)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        full.save(Path(tmp) / "index")
        t_save = time.perf_counter() - t0
        disk = sum(f.stat().st_size for f in (Path(tmp) / "index").rglob("*") if f.is_file())
        t0 = time.perf_counter()
        type(full).load(Path(tmp) / "index", emb, device="cpu")
        t_load = time.perf_counter() - t0

    # ---- per step and batched, out of fold ----------------------------------------------------------
    single_wall, single_cpu, rank_wall, rank_cpu, facade_wall, facade_cpu = [], [], [], [], [], []
    batched, batched_cpu = [], []
    n_fell = n_steps = 0
    for split in kfold(ds.trajectories, args.folds, seed=0):
        train = training_steps(split.train, ds.registry)
        test = training_steps(split.test, ds.registry)
        tr_ctx = ctx_all[[ctx_of[(s.trajectory_id, s.index)] for s in train]]
        te_ctx = ctx_all[[ctx_of[(s.trajectory_id, s.index)] for s in test]]
        trie = ExecutionTrie.build(train, res.tool_ids([s.gold for s in train]), tr_ctx, len(ds.registry),
                                   scorer.key, scorer.eps, "cpu")
        sc = build_scorer(args.scorer).attach(trie, res)
        te_np = te_ctx.numpy()
        items = list(zip(test, te_np))
        for it in items[:50]:  # warm-up
            sc.select_one(it[0], (it[1],), args.k)
        w, c = time_calls(lambda it, sc=sc: sc.select_one(it[0], (it[1],), args.k), items, args.repeats)
        single_wall += w
        single_cpu += c
        w, c = time_calls(lambda it, sc=sc: sc.rank_one(it[0], (it[1],)), items, 1)
        rank_wall += w
        rank_cpu += c
        msg_items = [(s.context, v) for s, v in items]
        w, c = time_calls(lambda it, sc=sc: sc.select_one(step_from_messages(it[0]), (it[1],), args.k),
                          msg_items, 1)
        facade_wall += w
        facade_cpu += c
        scores = sc.score_embedded(test, te_ctx)
        n_fell += int(scores.fell_back.sum())
        n_steps += len(test)
        # same answers on both paths (the tests check this too)
        sel = finalize(scores, args.k, sc.pad)
        assert all(sel.presented[i] == sc.select_one(s, (te_np[i],), args.k) for i, s in enumerate(test))
        for _ in range(args.batch_repeats):
            c0, t0 = time.process_time(), time.perf_counter()
            finalize(sc.score_embedded(test, te_ctx), args.k, sc.pad)
            batched.append(len(test) / (time.perf_counter() - t0))
            batched_cpu.append(len(test) / max(time.process_time() - c0, 1e-9))

    # ---- embedding ----------------------------------------------------------------------------------
    inner = emb.inner if isinstance(emb, CachedEmbedder) else emb
    rng = np.random.default_rng(0)
    sample = [all_steps[i] for i in rng.choice(len(all_steps), args.embed_samples, replace=False)]
    texts = [rendering.render(s.context) for s in sample]
    inner.encode(texts[:2])  # warm-up
    emb_ms = []
    for t in texts:
        t0 = time.perf_counter()
        inner.encode([t])
        emb_ms.append((time.perf_counter() - t0) * 1e3)
    hit_us = []
    for t in texts:
        t0 = time.perf_counter_ns()
        emb.encode([t])
        hit_us.append((time.perf_counter_ns() - t0) / 1e3)

    # ---- memory -------------------------------------------------------------------------------------
    trie = full.trie
    nbytes = trie.nbytes()
    per_edge = (trie.edge_tool.element_size() + trie.edge_count.element_size()
                + trie.edge_log_p.element_size()
                + trie.edge_norm.element_size() + trie.edge_memory.element_size() * trie.dim)
    table_bytes = deep_size(trie.nodes) + deep_size(trie.node_states)
    index_bytes = res.tool_index.vectors.nbytes * 2  # FAISS copy + numpy copy

    p50, p95 = statistics.median(single_cpu), percentile(single_cpu, 95)
    out = {
        "dataset": "bfcl", "scorer": args.scorer, "k": args.k, "tools": len(ds.registry),
        "trajectories": len(ds.trajectories), "steps": len(all_steps), "nodes": trie.n_nodes,
        "edges": trie.n_edges, "dim": trie.dim, "embed_all_s": t_embed, "build_s": t_build, "save_s": t_save,
        "load_s": t_load, "single_cpu_p50_us": p50, "single_cpu_p95_us": p95,
        "single_wall_p50_us": statistics.median(single_wall),
        "single_wall_p95_us": percentile(single_wall, 95),
        "rank_cpu_p50_us": statistics.median(rank_cpu), "rank_wall_p50_us": statistics.median(rank_wall),
        "facade_cpu_p50_us": statistics.median(facade_cpu),
        "facade_wall_p50_us": statistics.median(facade_wall),
        "batched_steps_per_s_median": statistics.median(batched), "batched_steps_per_s_best": max(batched),
        "batched_steps_per_cpu_s_median": statistics.median(batched_cpu),
        "fold_steps": n_steps / args.folds, "fell_back_share": n_fell / max(n_steps, 1),
        "embed_cold_ms_p50": statistics.median(emb_ms), "embed_cache_hit_us_p50": statistics.median(hit_us),
        "trie_tensor_bytes": nbytes, "bytes_per_edge": per_edge, "node_table_bytes": table_bytes,
        "tool_index_bytes": index_bytes, "disk_bytes": disk,
        "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(), "load_avg": os.getloadavg()[0],
    }
    share = p50 / (p50 + out["embed_cold_ms_p50"] * 1e3)
    print(f"\n## Tracer retriever on BFCL ({len(ds.registry)} tools, {len(ds.trajectories)} trajectories, "
          f"{len(all_steps)} steps; scorer {args.scorer}, k={args.k})\n")
    print("| measure | value |\n|---|---:|")
    rows = [
        ("trie nodes / edges (all trajectories)", f"{trie.n_nodes} / {trie.n_edges}"),
        ("build beyond embeddings (trie + priors + memories + FAISS index)", f"{t_build * 1e3:.1f} ms"),
        ("save / load the index", f"{t_save * 1e3:.1f} ms / {t_load * 1e3:.1f} ms"),
        (f"one step, select_one k={args.k}: p50 / p95 (thread CPU time)", f"{p50:.1f} / {p95:.1f} µs"),
        ("one step, select_one: p50 / p95 (wall clock)",
         f"{out['single_wall_p50_us']:.1f} / {out['single_wall_p95_us']:.1f} µs"),
        ("one step, full ranking (rank_one): p50 CPU / wall",
         f"{out['rank_cpu_p50_us']:.1f} / {out['rank_wall_p50_us']:.1f} µs"),
        ("one step from raw messages (step_from_messages + select_one): p50 CPU / wall",
         f"{out['facade_cpu_p50_us']:.1f} / {out['facade_wall_p50_us']:.1f} µs"),
        (f"batched, a fold (~{n_steps / args.folds:.0f} steps) incl. finalize: wall median / best",
         f"{out['batched_steps_per_s_median']:,.0f} / {out['batched_steps_per_s_best']:,.0f} steps/s"),
        ("batched, per second of process CPU time (median)",
         f"{out['batched_steps_per_cpu_s_median']:,.0f} steps/s"),
        ("held-out steps that fell back to vector search", f"{out['fell_back_share']:.1%}"),
        ("MiniLM, one context, cold (p50)", f"{out['embed_cold_ms_p50']:.1f} ms"),
        ("embedding cache hit (p50)", f"{out['embed_cache_hit_us_p50']:.1f} µs"),
        ("share of a cold step that is the embedding", f"{1 - share:.2%}"),
        (f"trie tensors: bytes per edge (d = {trie.dim})", f"{per_edge} B"),
        ("trie tensors total / node table (Python) / tool index",
         f"{nbytes / 1024:.0f} KiB / {table_bytes / 1024:.0f} KiB / {index_bytes / 1024:.0f} KiB"),
        ("saved index on disk", f"{disk / 1024:.0f} KiB"),
    ]
    for k_, v in rows:
        print(f"| {k_} | {v} |")
    print(f"\n{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, load average "
          f"{out['load_avg']:.1f} during the run.\n\nCommand: `python -m benchmarks.bench_retriever "
          + " ".join(argv if argv is not None else sys.argv[1:]) + "`")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
