"""Cost of one Retriever.select as the user message grows (the clip before tokenizing, docs/storage.md).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_long_input

Fits ``tracer_fixed`` on data/example with the bundled MiniLM on CPU (in-memory cache, so each message is
encoded once) and times one ``select`` per message length, after a warm-up call.
"""

from __future__ import annotations

import time

from tracer.encode.embedders import CachedEmbedder, SentenceTransformerEmbedder
from tracer.retriever import Retriever

SENTENCE = "Find me a flight to Boston and book it. "


def main(lengths=(1_000, 100_000, 1_000_000)) -> None:
    r = Retriever.from_dataset("data/example", "tracer_fixed", device="cpu",
                               embedder=CachedEmbedder(SentenceTransformerEmbedder(device="cpu", progress=0)))
    r.select([{"role": "user", "content": "warm up"}], k=3)
    print("| user message (characters) | one select |\n|---:|---:|")
    for n in lengths:
        msg = [{"role": "user", "content": (SENTENCE * (n // len(SENTENCE) + 1))[:n]}]
        t0 = time.perf_counter()
        r.select(msg, k=3)
        print(f"| {n:,} | {time.perf_counter() - t0:.3f} s |")


if __name__ == "__main__":
    main()
