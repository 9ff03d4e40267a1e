"""One text through the static encoder, as a live step encodes it: model2vec's ``StaticModel.encode`` against
``StaticEmbedder.encode``, which calls model2vec's batch step without ``encode``'s wrapper (the same bits).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_static_encode [--model .cache/encoders/m2v-trained-<hash>]
        [--n 1000] [--repeats 3]

BFCL's query contexts as tracer_plus renders them (``since_user``, call names, no results, users joined),
``n`` of them in a seeded order, each encoded alone by both, the two taking turns text by text and the first
of them alternating (paired: a change in the machine's load falls on both). Thread CPU time, one thread, the
tokenizers' thread pool off (as ``bench_frontier`` runs). ``--model``: a static model folder (a trained
table, ``m2v-trained-*``); by default the distillation of MiniLM (``embedder=static``).
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from tracer.core.context import ContextRendering
from tracer.core.steps import extract_all
from tracer.core.threads import machine
from tracer.data import load_dataset
from tracer.encode.static import StaticEmbedder
from tracer.scorers.bm25 import query_text

QUERY = ContextRendering(window="since_user", calls="names", results="none", join_users=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a static model folder (default: MiniLM's distillation)")
    ap.add_argument("--n", type=int, default=1000, help="texts, each timed once per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.n < 1 or args.repeats < 1:
        ap.error("--n and --repeats must be >= 1")
    emb = StaticEmbedder(args.model)
    steps = extract_all(load_dataset("bfcl").trajectories)
    texts = [query_text(QUERY, s) for s in random.Random(0).sample(steps, min(args.n, len(steps)))]
    ways = {"StaticModel.encode": lambda t: emb.model.encode([t], use_multiprocessing=False),
            "StaticEmbedder.encode": lambda t: emb.encode([t])}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for i, text in enumerate(texts):
            for name in (list(ways) if i % 2 else list(ways)[::-1]):
                t0 = time.thread_time_ns()
                ways[name](text)
                times[name].append((time.thread_time_ns() - t0) / 1000)
    diff = np.subtract(times["StaticModel.encode"], times["StaticEmbedder.encode"])
    print(f"| encode one text | p50 µs | p95 µs |   ({len(texts)} BFCL query contexts, median "
          f"{int(np.median([len(t) for t in texts]))} characters, x{args.repeats}; one thread, load avg "
          f"{os.getloadavg()[0]:.2f}; {machine()}; {emb.name})")
    print("|---|---:|---:|")
    for name, ts in times.items():
        print(f"| `{name}` | {np.percentile(ts, 50):.1f} | {np.percentile(ts, 95):.1f} |")
    print(f"| paired difference | {np.percentile(diff, 50):.1f} | {np.percentile(diff, 95):.1f} |")


if __name__ == "__main__":
    main()
