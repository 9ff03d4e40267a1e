"""Per-step cost beyond the context embedding: the batched path with a batch of one against the single-step
path.

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.bench_step [--scorers tracer_fixed tracer tracer_plus] \
        [--k 5]
        [--members 10]      # also tracer_plus with the best preset's candidate model, the mean of 10 MLPs
        [--novel]           # also tracer_plus with the cold-start preset's zero-shot settings
        [--zs-candidates]   # also tracer_plus with the zero-shot fusion proposing its candidates
        [--usage]           # also tracer_plus with two novel slots, without and with usage vectors
        [--request]         # also tracer_plus without its request evidence (request: null), the cost of it
        [--novel-from vector bm25]  # also tracer_plus with its novel slots over these rankings
        [--novel-toolkit 0]         # also tracer_plus with zero_shot.novel_toolkit each of these (0: off)

BFCL (registry large), fitted on folds 1-4 (seed 0), the held-out fold 0's steps embedded once
(through ``.cache/embeddings``). For each scorer and step, thread CPU time (one torch and one BLAS
thread, best of 3 passes per step) of

- batch of one: ``finalize(scorer.score_embedded([step], *contexts), k, scorer.pad).presented[0]``;
- live path: ``scorer.select_one(step, contexts, k)`` (:mod:`tracer.scorer_base.single_step` for the
  fixed blend and tracer_plus; the batched path with a batch of one for the learned blend).

Prints p50 / p95 in microseconds and whether both paths present the same tools on every step.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import torch

from benchmarks.timing import cpu_us
from tracer.build import build_dataset, build_embedder, build_scorer, load_preset, plain
from tracer.core.folds import assign_folds
from tracer.core.steps import extract_all
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scorers", nargs="+", default=["tracer_fixed", "tracer", "tracer_plus"])
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--members", type=int, default=0,
                    help="also tracer_plus with model: mlp and head.members N (0: not)")
    ap.add_argument("--novel", action="store_true",
                    help="also tracer_plus with preset/cold_start's zero_shot settings")
    ap.add_argument("--zs-candidates", action="store_true",
                    help="also tracer_plus with zero_shot.candidates (the fusion among the candidates)")
    ap.add_argument("--usage", action="store_true",
                    help="also tracer_plus with novel slots (a fusion every step), zero_shot.usage off, 1")
    ap.add_argument("--request", action="store_true",
                    help="also tracer_plus without its request evidence (request: null)")
    ap.add_argument("--novel-from", nargs="*", default=[],
                    help="also tracer_plus with zero_shot.novel_from each of these (vector, bm25, ...)")
    ap.add_argument("--novel-toolkit", nargs="*", type=int, default=[],
                    help="also tracer_plus with zero_shot.novel_toolkit each of these (0: off)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ds = build_dataset("bfcl", "large")
    res = Resources.build(ds.registry, build_embedder("minilm"), device="cpu")
    fold_of = assign_folds([t.group for t in ds.trajectories], 5, 0)
    train = [t for t in ds.trajectories if fold_of[t.group] != 0]
    test = [s for s in extract_all([t for t in ds.trajectories if fold_of[t.group] == 0])
            if s.gold in ds.registry]
    print("| scorer | batch of one: p50 / p95 µs | live select_one: p50 / p95 µs | same presented sets |\n"
          "|---|---:|---:|:---:|")
    runs = [(name, {}) for name in a.scorers]
    if a.members:
        runs.append((f"tracer_plus, {a.members} MLPs", {"model": "mlp", "head": {"members": a.members}}))
    if a.novel:
        zero = plain(load_preset("cold_start")["scorer"]["zero_shot"])
        runs.append((f"tracer_plus, novel slots {zero['novel']}x{zero['slots']}"
                     + (", fusion candidates" if zero.get("candidates") else ""), {"zero_shot": zero}))
    if a.zs_candidates:
        runs.append(("tracer_plus, zero-shot candidates", {"zero_shot": {"candidates": True}}))
    if a.usage:
        runs += [(f"tracer_plus, novel slots 3x2, usage {u}",
                  {"zero_shot": {"novel": 3, "slots": 2, "usage": u}}) for u in (None, 1.0)]
    if a.request:
        runs.append(("tracer_plus, no request evidence", {"request": None}))
    runs += [(f"tracer_plus, novel slots over {src}", {"zero_shot": {"novel_from": src}})
             for src in a.novel_from]
    runs += [(f"tracer_plus, novel_toolkit {j}", {"zero_shot": {"novel_toolkit": j}})
             for j in a.novel_toolkit]
    for name, overrides in runs:
        sc = build_scorer("tracer_plus" if overrides else name, **overrides)
        sc.fit(train, res)
        contexts = sc.embed(test)                                                 # tuple of [B, d]
        # one step's contexts, [1, d] each
        rows = [tuple(c[i:i + 1] for c in contexts) for i in range(len(test))]

        def batched(i, sc=sc, rows=rows):
            return finalize(sc.score_embedded([test[i]], *rows[i]), a.k, sc.pad).presented[0]

        def live(i, sc=sc, rows=rows):
            return sc.select_one(test[i], rows[i], a.k)

        same = all(batched(i) == live(i) for i in range(len(test)))
        b, o = cpu_us(batched, len(test)), cpu_us(live, len(test))
        print(f"| {name} ({len(test)} steps, {len(ds.registry)} tools, k={a.k}) | {np.percentile(b, 50):.0f} "
              f"/ {np.percentile(b, 95):.0f} | {np.percentile(o, 50):.0f} / {np.percentile(o, 95):.0f} | "
              f"{same} |",
              flush=True)


if __name__ == "__main__":
    main()
