"""Scale check: the Tracer index on synthetic corpora of up to 1,000,000 trajectories over 10,000 tools.

    python -m benchmarks.bench_scale              # 10k, 100k and 1M trajectories (a few minutes)
    python -m benchmarks.bench_scale --quick      # 10k and 100k

The corpus (seeded): each trajectory has 1-3 user turns; a turn's first tool is drawn from a Zipf
law (exponent 1.1) over the registry; each next tool follows a skewed Markov chain (every tool has
8 successors, drawn from the same Zipf law, chosen with probability proportional to 1/rank^1.5);
a turn stops after each call with probability 0.35 (at most 6 calls). Context embeddings are random
unit vectors of dimension d = 384 (MiniLM's): they stand in for the embedding, whose cost is not
part of what is measured. Tool vectors are random unit vectors too; the fallback index is exact
(``Flat``). The key is the paper's: the turn-local prefix.

Per corpus: build time (state tuples + trie: counts, priors, edge memories, from precomputed contexts, fed in
chunks of ``--chunk-steps`` steps through :meth:`ExecutionTrie.update`, plus the FAISS tool index), the trie's
tensor memory and bytes per edge, the Python node table, the saved size, save time and load time under each
verification mode (none, sizes, SHA-256), and the per-step cost of ``select_one`` (k=5, thread CPU time) over
``--queries`` steps drawn from a fresh run of the same chain (so some prefixes are unseen), split into
turn-opening steps (the root node, whose children are most of the registry) and deeper steps. Rankings after
load are checked to be identical.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
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

from benchmarks.synthetic import Chain, step_states, unit_rows


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def node_table_bytes(trie, sample: int = 20000) -> int:
    """Dict plus tuples (the names are shared with the registry), estimated from a sample of states."""
    states = trie.node_states
    if not states:
        return sys.getsizeof(trie.nodes)
    idx = np.random.default_rng(0).integers(0, len(states), min(sample, len(states)))
    per_tuple = statistics.fmean(sys.getsizeof(states[i]) for i in idx)
    return int(sys.getsizeof(trie.nodes) + sys.getsizeof(states) + per_tuple * len(states))


def run(n_traj: int, args, chain: Chain, names: list[str], tool_vecs: torch.Tensor, out_dir: Path) -> dict:
    from tracer.build import build_scorer
    from tracer.core.types import Registry, Tool
    from tracer.encode.index import ToolIndex
    from tracer.memory.trie import ExecutionTrie
    from tracer.scorer_base.resources import Resources
    from tracer.scorer_base.single_step import children_one
    from tracer.scorers.tracer import TracerScorer

    class RandomEmbedder:  # stands in for the embedder in the saved index's metadata; never encodes
        name, dim = f"random-unit-{args.dim}", args.dim

        def encode(self, texts):
            raise RuntimeError("the synthetic benchmark never embeds text")

    rng = np.random.default_rng(args.seed + n_traj)
    gen = torch.Generator().manual_seed(args.seed + n_traj)
    registry = Registry(Tool(n) for n in names)
    t_gen = t_build = t_ctx = 0.0
    t0 = time.perf_counter()
    index = ToolIndex(names, tool_vecs)
    res = Resources(registry, RandomEmbedder(), index, "cpu")
    trie = ExecutionTrie(len(names), args.dim, device="cpu", dtype=getattr(torch, args.dtype))
    t_build += time.perf_counter() - t0
    n_steps = 0
    per_chunk = max(1, int(args.chunk_steps / 4.5))  # ~4.5 steps per trajectory
    for lo in range(0, n_traj, per_chunk):
        t0 = time.perf_counter()
        seq, lengths = chain.turns(min(per_chunk, n_traj - lo), rng)
        t_gen += time.perf_counter() - t0
        t0 = time.perf_counter()
        states, gold = step_states(seq, lengths, names)
        t_build += time.perf_counter() - t0
        t0 = time.perf_counter()
        ctx = unit_rows(len(states), args.dim, gen)                                  # [S, d]
        t_ctx += time.perf_counter() - t0
        t0 = time.perf_counter()
        trie.update(states, torch.from_numpy(gold), ctx)
        t_build += time.perf_counter() - t0
        n_steps += len(states)
        del states, gold, ctx
        gc.collect()
    t0 = time.perf_counter()
    scorer = build_scorer("tracer_fixed").attach(trie, res)
    t_build += time.perf_counter() - t0
    rss_after_build = rss_bytes()

    # queries: a fresh run of the chain, random contexts
    qrng = np.random.default_rng(args.seed + 10**9)
    seq, lengths = chain.turns(args.queries, qrng)
    q_states, _ = step_states(seq, lengths, names)
    q_states = [q_states[i] for i in qrng.permutation(len(q_states))[: args.queries]]
    q_ctx = unit_rows(len(q_states), args.dim, torch.Generator().manual_seed(7)).numpy()
    for i in range(min(50, len(q_states))):  # warm-up (also fills the float64 copies of wide nodes)
        scorer.select_one(q_states[i], (q_ctx[i],), args.k)
    cpu_us, root = [], []
    for s, c in zip(q_states, q_ctx):
        c0 = time.thread_time_ns()
        scorer.select_one(s, (c,), args.k)
        cpu_us.append((time.thread_time_ns() - c0) / 1e3)
        root.append(len(s) == 0)
    cpu_us, root = np.asarray(cpu_us), np.asarray(root)
    trie_us = []
    for s, c in zip(q_states, q_ctx):  # the trie part alone: children, priors, gate
        c0 = time.thread_time_ns()
        ch = children_one(trie, s, c)
        kappa_s = ch.log_p + ch.log_l
        del kappa_s
        trie_us.append((time.thread_time_ns() - c0) / 1e3)
    trie_us = np.asarray(trie_us)
    fell = np.asarray([scorer.score_one(s, c, with_fallback=False)[3] for s, c in zip(q_states, q_ctx)])
    expected = [scorer.select_one(s, (c,), args.k) for s, c in zip(q_states[:200], q_ctx[:200])]

    # save and load
    path = out_dir / f"index_{n_traj}"
    t0 = time.perf_counter()
    scorer.save(path)
    t_save = time.perf_counter() - t0
    disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    n_nodes, n_edges, nbytes = trie.n_nodes, trie.n_edges, trie.nbytes()
    table = node_table_bytes(trie)
    per_edge = (trie.edge_tool.element_size() + trie.edge_count.element_size()
                + trie.edge_log_p.element_size()
                + trie.edge_norm.element_size() + trie.edge_memory.element_size() * trie.dim)
    del scorer, trie, res
    gc.collect()
    # load under each verification mode, best of 2 (warm page cache: the index was just written); "none" is
    # the load of earlier versions, "sha256" the default
    t_load = {}
    for mode in ("none", "size", "sha256"):
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            loaded = TracerScorer.load(path, RandomEmbedder(), device="cpu", verify=mode)
            times.append(time.perf_counter() - t0)
            if mode != "sha256":
                del loaded
                gc.collect()
        t_load[mode] = min(times)
    same = all(loaded.select_one(s, (c,), args.k) == e
               for s, c, e in zip(q_states[:200], q_ctx[:200], expected))
    del loaded
    gc.collect()
    shutil.rmtree(path, ignore_errors=True)
    return {
        "trajectories": n_traj, "steps": n_steps, "nodes": n_nodes, "edges": n_edges,
        "generate_s": t_gen, "contexts_s": t_ctx, "build_s": t_build, "save_s": t_save,
        "load_s": t_load["sha256"], "load_none_s": t_load["none"], "load_size_s": t_load["size"],
        "trie_bytes": nbytes, "bytes_per_edge": per_edge, "node_table_bytes": table, "disk_bytes": disk,
        "rss_after_build": rss_after_build,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "step_p50_us": float(np.median(cpu_us)), "step_p95_us": float(np.percentile(cpu_us, 95)),
        "root_share": float(root.mean()), "fell_back_share": float(fell.mean()),
        "fell_back_p50_us": float(np.median(cpu_us[fell])) if fell.any() else float("nan"),
        "kept_p50_us": float(np.median(cpu_us[~fell])) if (~fell).any() else float("nan"),
        "root_p50_us": float(np.median(cpu_us[root])) if root.any() else float("nan"),
        "deep_p50_us": float(np.median(cpu_us[~root])) if (~root).any() else float("nan"),
        "trie_root_p50_us": float(np.median(trie_us[root])) if root.any() else float("nan"),
        "trie_deep_p50_us": float(np.median(trie_us[~root])) if (~root).any() else float("nan"),
        "loaded_identical": same,
    }


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--quick", action="store_true", help="10k and 100k trajectories only")
    ap.add_argument("--tools", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="edge-memory storage")
    ap.add_argument("--chunk-steps", type=int, default=1_000_000, help="steps per ExecutionTrie.update call")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="where indexes are saved (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes = [s for s in args.sizes if s <= 100_000]
    torch.set_num_threads(args.threads)
    chain = Chain(args.tools, args.seed)
    names = [f"tool_{i:05d}" for i in range(args.tools)]
    tool_vecs = unit_rows(args.tools, args.dim, torch.Generator().manual_seed(args.seed + 1))
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="tracer_scale_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.sizes:
        print(f"corpus of {n:,} trajectories ...", file=sys.stderr, flush=True)
        rows.append(run(n, args, chain, names, tool_vecs, out_dir))
        print(rows[-1], file=sys.stderr, flush=True)
    if args.out_dir is None:
        shutil.rmtree(out_dir, ignore_errors=True)

    mib = 1 << 20
    print(f"\n## Scale: {args.tools:,} tools, d = {args.dim}, edge memory {args.dtype}, "
          f"prefix key, k = {args.k}\n")
    print("| trajectories | steps | nodes | edges | build | trie tensors (B/edge) | node table | on disk | "
          "save / load | step p50 / p95 | turn-opening p50 (trie part) | deeper p50 (trie part) | fell back: "
          "share, p50 | trie answered p50 | loaded identical |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for r in rows:
        print(f"| {r['trajectories']:,} | {r['steps']:,} | {r['nodes']:,} | {r['edges']:,} | "
              f"{r['build_s']:.1f} s | {r['trie_bytes'] / mib:,.0f} MiB ({r['bytes_per_edge']}) | "
              f"{r['node_table_bytes'] / mib:,.0f} MiB | {r['disk_bytes'] / mib:,.0f} MiB | "
              f"{r['save_s']:.1f} / {r['load_s']:.1f} s | {r['step_p50_us']:,.0f} / {r['step_p95_us']:,.0f} "
              f"µs | {r['root_p50_us']:,.0f} ({r['trie_root_p50_us']:,.0f}) µs "
              f"| {r['deep_p50_us']:,.0f} ({r['trie_deep_p50_us']:,.0f}) µs "
              f"| {r['fell_back_share']:.0%}, {r['fell_back_p50_us']:,.0f} µs | {r['kept_p50_us']:,.0f} µs "
              f"| {'yes' if r['loaded_identical'] else 'NO'} |")
    print("\n## Save and load with verification (docs/storage.md)\n")
    print("| trajectories | on disk | save | load, no check | load, sizes | load, SHA-256 (default) | "
          "SHA-256 adds |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['trajectories']:,} | {r['disk_bytes'] / mib:,.0f} MiB | {r['save_s']:.2f} s | "
              f"{r['load_none_s']:.2f} s | {r['load_size_s']:.2f} s | {r['load_s']:.2f} s | "
              f"{r['load_s'] - r['load_none_s']:+.2f} s |")
    print(f"\nPer-step cost: thread CPU time of select_one over {args.queries} query steps from a fresh run "
          f"of the chain ({rows[-1]['root_share']:.0%} open a turn). The trie part is the children's cosines "
          f"and both priors; a step that falls back (or pads) also scans all {args.tools:,} tools (a float32 "
          "pass, then exact rescoring of the leaders), and a turn-opening step scores the root's children, "
          "most of the registry (float64): both are O(registry x d) and do not grow with the corpus. "
          "Build excludes generating the tool sequences and the random "
          "contexts (which stand in for the embedding). Peak RSS of the whole run: "
          f"{max(r['peak_rss'] for r in rows) / (1 << 30):.1f} GiB. Torch threads: {args.threads}. "
          f"Load average: {os.getloadavg()[0]:.1f}.")
    print("\nCommand: `python -m benchmarks.bench_scale "
          + " ".join(argv if argv is not None else sys.argv[1:]) + "`")
    return rows


if __name__ == "__main__":
    main()
