"""A live step of saved indexes on BFCL contexts whose requests are new to them: what a gateway pays on the
first step of a turn, when nothing the request evidence computes is cached yet.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_new_requests --index outputs/demo/index OTHER_INDEX

Each index is loaded as a server loads it (``Retriever.load``) and answers ``select_ids`` for every
``--every``-th step of BFCL (distinct contexts, most of them distinct requests), after ``--warm`` steps of
warm-up. The indexes take turns step by step, so a change in the machine's load falls on all of them alike
(paired). Reported per index: wall and thread-CPU p50 and p95 in milliseconds (one thread).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from tracer.core.steps import extract_all
from tracer.data import load_dataset
from tracer.retriever import Retriever


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", nargs="+", required=True, help="saved index folders (train.py's <run>/index)")
    ap.add_argument("--every", type=int, default=15, help="every n-th BFCL step (distinct contexts)")
    ap.add_argument("--n", type=int, default=300, help="steps timed per index, warm-up included")
    ap.add_argument("--warm", type=int, default=20, help="warm-up steps, not timed")
    args = ap.parse_args()
    if args.every < 1 or args.n <= args.warm or args.warm < 0:
        ap.error("--every must be >= 1 and --n greater than --warm >= 0")
    torch.set_num_threads(1)
    indexes = [Retriever.load(d) for d in args.index]
    steps = extract_all(load_dataset("bfcl").trajectories)[::args.every][:args.n]
    conversations = [list(s.context) for s in steps]
    wall: list[list[float]] = [[] for _ in indexes]
    cpu: list[list[float]] = [[] for _ in indexes]
    for i, messages in enumerate(conversations):
        for j, r in enumerate(indexes):
            t0, c0 = time.perf_counter(), time.thread_time()
            r.select_ids(messages)
            if i >= args.warm:
                wall[j].append((time.perf_counter() - t0) * 1e3)
                cpu[j].append((time.thread_time() - c0) * 1e3)
    print(f"`OMP_NUM_THREADS=1 python -m benchmarks.bench_new_requests --index {' '.join(args.index)}`; "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print("| index | steps | wall p50 / p95 ms | thread CPU p50 / p95 ms |\n|---|---:|---:|---:|")
    for d, w, c in zip(args.index, wall, cpu):
        q = statistics.quantiles
        print(f"| `{d}` | {len(w)} | {statistics.median(w):.2f} / {q(w, n=20)[-1]:.2f} | "
              f"{statistics.median(c):.2f} / {q(c, n=20)[-1]:.2f} |")


if __name__ == "__main__":
    main()
