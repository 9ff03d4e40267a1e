"""Registry scale on real tool text: BFCL's logs inside registries of up to ~100k public tools.

    python -m benchmarks.catalogue --mirrors DIR          # once: data/catalogue/tools.jsonl
    OMP_NUM_THREADS=1 python -m benchmarks.bench_registry [--sizes 240 2000 10000 100000] [--out FILE]

Registries are nested: BFCL's ``registry=large`` (its 128 tools and 112 tau2/API-Bank distractors, the
240-tool figure of docs/results.md), then catalogue tools in a seeded order up to each size (``all``, or a
size above the catalogue, takes every tool). Tool texts are embedded by MiniLM through ``.cache/embeddings``
(about 100 tools/s on 2 CPU cores the first time; not part of the build time below).

Per size and tool index (``exact``: FAISS ``Flat``; ``hnsw``: ``ANN_FACTORY``, ``HNSW32,SQfp16``, retrieving
``--ann-k`` tools with ``efSearch`` ``--ef-search``): tracer_plus (zero-shot MiniLM) fitted on folds 1-4, then
over fold 0's steps: build time (tool index from the vectors, and the fit), resident memory added, the saved
index's size, one live step's thread CPU time (``select_one``, k = 5, contexts embedded beforehand: encode
excluded; one torch, BLAS and FAISS thread; best of ``--repeats``), and recall@1 / recall@5 of the presented
tools. The ``hnsw`` row is paired with the ``exact`` one on the same steps: the recall the approximation
loses, and on how many steps it turned a hit into a miss and back. The encode is timed once (MiniLM, one
context, no cache) and added for the "encode included" column.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import faiss
import numpy as np
import torch

from benchmarks.catalogue import load_catalogue, with_distractors
from benchmarks.timing import cpu_us
from tracer.build import build_dataset, build_embedder, build_scorer
from tracer.core.folds import assign_folds
from tracer.core.steps import extract_all
from tracer.core.types import Registry
from tracer.encode.embedders import encode_tools
from tracer.encode.index import ANN_FACTORY, ANN_K, ToolIndex
from tracer.scorer_base.resources import Resources


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(registry: Registry, vectors: torch.Tensor, embedder, train, test, factory: str, a) -> dict:
    """Build, fit and time one registry under one tool index."""
    before = rss()
    t0 = time.perf_counter()
    index = ToolIndex(registry.names, vectors, factory, use_gpu=False, ann_k=a.ann_k, ef_search=a.ef_search)
    t1 = time.perf_counter()
    res = Resources(registry, embedder, index, device="cpu")
    scorer = build_scorer("tracer_plus")
    scorer.fit(train, res)
    t2 = time.perf_counter()
    added = rss() - before
    with tempfile.TemporaryDirectory() as tmp:
        scorer.save(Path(tmp) / "index")
        size = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
    contexts = scorer.embed(test)
    rows = [tuple(c[i:i + 1] for c in contexts) for i in range(len(test))]
    presented = [scorer.select_one(s, rows[i], 5) for i, s in enumerate(test)]
    gold = [registry.id(s.gold) for s in test]
    repeats = a.repeats if index.exact is False or len(registry) <= 10_000 else 1
    us = cpu_us(lambda i: scorer.select_one(test[i], rows[i], 5), len(test), repeats)
    return {"tools": len(registry), "index": "exact" if index.exact else f"hnsw, ef {index.ef_search}",
            "index_s": t1 - t0,
            "fit_s": t2 - t1, "rss_added": added, "saved_bytes": size, "p50_us": float(np.percentile(us, 50)),
            "p95_us": float(np.percentile(us, 95)),
            "hit1": [int(p[:1] == (g,)) for p, g in zip(presented, gold)],
            "hit5": [int(g in p) for p, g in zip(presented, gold)]}


def encode_us(embedder, test, n: int = 50) -> float:
    """MiniLM on one rendered context, no cache: p50 wall time in µs over ``n`` steps."""
    scorer = build_scorer("tracer_plus")
    texts = [scorer.query_rendering.render(s.context) for s in test[:n]]
    inner = embedder.inner
    inner.encode(texts[:2])
    out = []
    for t in texts:
        t0 = time.perf_counter()
        inner.encode([t])
        out.append((time.perf_counter() - t0) * 1e6)
    return float(np.median(out))


def table(results: list[dict], enc: float) -> str:
    lines = [("| tools | index | build: index / fit | memory added | saved index "
              "| step p50 / p95 (encode excl.) | p50 encode incl. | recall@1 | recall@5 "
              "| hnsw − exact recall@5 (hits lost / gained) |"),
             "|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    exact = {r["tools"]: r for r in results if r["index"] == "exact"}
    for r in results:
        r1, r5 = np.mean(r["hit1"]), np.mean(r["hit5"])
        paired = ""
        if r["index"] != "exact" and r["tools"] in exact:
            e = np.array(exact[r["tools"]]["hit5"])
            h = np.array(r["hit5"])
            paired = (f"{h.mean() - e.mean():+.4f} ({int(((e == 1) & (h == 0)).sum())} / "
                      f"{int(((e == 0) & (h == 1)).sum())})")
        lines.append(f"| {r['tools']:,} | {r['index']} | {r['index_s']:.1f} s / {r['fit_s']:.1f} s | "
                     f"{r['rss_added'] / 2**20:,.0f} MiB | {r['saved_bytes'] / 2**20:,.1f} MiB | "
                     f"{r['p50_us']:,.0f} / {r['p95_us']:,.0f} µs | {(r['p50_us'] + enc) / 1000:,.1f} ms | "
                     f"{r1:.3f} | {r5:.3f} | {paired} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["240", "2000", "10000", "100000"])
    ap.add_argument("--indexes", nargs="+", default=["exact", "hnsw"], choices=["exact", "hnsw"])
    ap.add_argument("--ann-k", type=int, default=ANN_K)
    ap.add_argument("--ef-search", type=int, help="HNSW's breadth (default: ef_search_for the size)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    ds = build_dataset("bfcl", "large")
    catalogue = load_catalogue()
    fold_of = assign_folds([t.group for t in ds.trajectories], 5, 0)
    train = [t for t in ds.trajectories if fold_of[t.group] != 0]
    test = [s for s in extract_all([t for t in ds.trajectories if fold_of[t.group] == 0])
            if s.gold in ds.registry]
    embedder = build_embedder("minilm", cache_dir=".cache/embeddings")
    biggest = with_distractors(ds.registry, catalogue, None if "all" in a.sizes else max(map(int, a.sizes)))
    sizes = [len(biggest) if s == "all" else int(s) for s in a.sizes]
    vectors = encode_tools(embedder, [t.search_text for t in biggest])                  # [N, d]
    results = []
    for size in sizes:
        n = min(size, len(biggest))
        registry = Registry(list(biggest)[:n])
        for kind in a.indexes:
            factory = "Flat" if kind == "exact" else ANN_FACTORY
            results.append(run(registry, vectors[:n], embedder, train, test, factory, a))
            r = results[-1]
            print(f"{n} {kind}: p50 {r['p50_us']:.0f} µs, recall@5 {np.mean(r['hit5']):.3f}", flush=True)
    enc = encode_us(embedder, test)
    print(f"\n{len(test)} BFCL steps (fold 0), k = 5; MiniLM encode p50 {enc / 1000:.1f} ms\n")
    print(table(results, enc))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"encode_us": enc, "rows": results}, indent=1))


if __name__ == "__main__":
    main()
