"""Per-step cost of tracer_plus beyond the context embedding, on one BFCL fold.

    python scripts/bench_tracer_plus.py [--registry large] [--k 5] [--fold 0]

Fits tracer_plus on the other folds (contexts through the embedding cache), embeds the held-out
steps' contexts once, then times ``select_one(step, (memory, query), k)`` one step at a time (thread
CPU time, one torch and one BLAS thread) and checks it against the batched path.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--registry", default="large")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--folds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from tracer.build import build_dataset, build_embedder, build_scorer
    from tracer.core.folds import assign_folds
    from tracer.core.steps import extract_all
    from tracer.scoring.ranking import finalize
    from tracer.scoring.resources import Resources

    ds = build_dataset("bfcl", a.registry)
    res = Resources.build(ds.registry, build_embedder("minilm"), device="cpu")
    fold_of = assign_folds([t.group for t in ds.trajectories], a.folds, 0)
    train = [t for t in ds.trajectories if fold_of[t.group] != a.fold]
    test = [s for s in extract_all([t for t in ds.trajectories if fold_of[t.group] == a.fold]) if s.gold in ds.registry]
    sc = build_scorer("tracer_plus")
    sc.fit(train, res)
    mem = res.embed(test, sc.memory_rendering).numpy()
    query = res.embed(test, sc.query_rendering).numpy()
    for i, s in enumerate(test[:50]):  # warm-up
        sc.select_one(s, (mem[i], query[i]), a.k)
    cpu = []
    for _ in range(3):
        for i, s in enumerate(test):
            t0 = time.thread_time_ns()
            sc.select_one(s, (mem[i], query[i]), a.k)
            cpu.append((time.thread_time_ns() - t0) / 1000)
    per_step = np.asarray(cpu).reshape(3, len(test)).min(0)  # best of 3 per step
    batched = finalize(sc.score(test), a.k, sc.pad).presented
    same = all(tuple(batched[i]) == tuple(sc.select_one(s, (mem[i], query[i]), a.k)) for i, s in enumerate(test))
    print(f"| tracer_plus select_one (BFCL fold {a.fold}, {len(test)} steps, {len(ds.registry)} tools, k={a.k}) | "
          f"p50 {np.percentile(per_step, 50):.0f} µs / p95 {np.percentile(per_step, 95):.0f} µs (thread CPU, best of 3) "
          f"| single-step == batched: {same} |")


if __name__ == "__main__":
    main()
