"""Which approximate index for the tool registry: FAISS HNSW and IVF settings on real queries.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_ann [--sizes 10000 all]

The registry is BFCL's ``registry=large`` grown with the public catalogue (``benchmarks/catalogue.py``, as
``bench_registry`` grows it); the queries are the query contexts of BFCL's fold-0 steps (tracer_plus's query
rendering, MiniLM). Per index: build time, one query's search time (thread CPU time, one FAISS thread, p50)
and the share of the exact top 10 it returns among its first ``k``. The end-to-end recall of tracer_plus over
the chosen index is ``bench_registry``'s.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import faiss
import numpy as np
import torch

from benchmarks.catalogue import load_catalogue, with_distractors
from tracer.build import build_dataset, build_embedder, build_scorer
from tracer.core.folds import assign_folds
from tracer.core.steps import extract_all
from tracer.encode.embedders import encode_tools

# (FAISS factory, efSearch or nprobe, k); "IVF{n}" takes n * sqrt(N) lists
SETTINGS = [("HNSW16,Flat", 32, 16), ("HNSW16,Flat", 64, 32), ("HNSW32,Flat", 32, 16),
            ("HNSW32,Flat", 64, 32), ("HNSW32,Flat", 128, 32), ("HNSW32,SQfp16", 32, 32),
            ("HNSW32,SQfp16", 64, 32), ("HNSW32,SQ8", 64, 32), ("IVF4,Flat", 16, 32),
            ("IVF4,Flat", 32, 32), ("IVF4,Flat", 64, 32)]


def build(factory: str, vectors: np.ndarray) -> faiss.Index:
    if factory.startswith("IVF"):
        head, rest = factory.split(",", 1)
        factory = f"IVF{int(int(head[3:]) * np.sqrt(len(vectors)))},{rest}"
    index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    return index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["10000", "all"])
    a = ap.parse_args()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    ds = build_dataset("bfcl", "large")
    catalogue = load_catalogue()
    emb = build_embedder("minilm", cache_dir=".cache/embeddings")
    fold_of = assign_folds([t.group for t in ds.trajectories], 5, 0)
    steps = [s for s in extract_all([t for t in ds.trajectories if fold_of[t.group] == 0])
             if s.gold in ds.registry]
    rendering = build_scorer("tracer_plus").query_rendering
    queries = emb.encode([rendering.render(s.context) for s in steps]).numpy().astype(np.float32)  # [Q, d]
    print("| tools | index | build | search p50 | exact top 10 found |\n|---:|:---|---:|---:|---:|")
    for size in a.sizes:
        reg = with_distractors(ds.registry, catalogue, None if size == "all" else int(size))
        vectors = encode_tools(emb, [t.search_text for t in reg]).numpy().astype(np.float32)  # [N, d]
        exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]                           # [Q, 10]
        for factory, breadth, k in SETTINGS:
            t0 = time.perf_counter()
            index = build(factory, vectors)
            built = time.perf_counter() - t0
            if factory.startswith("HNSW"):
                index.hnsw.efSearch, name = breadth, f"{factory}, efSearch {breadth}, k {k}"
            else:
                index.nprobe, name = breadth, f"IVF{index.nlist},Flat, nprobe {breadth}, k {k}"
            us, found = [], []
            for q, ex in zip(queries, exact):
                t0 = time.thread_time_ns()
                _, ids = index.search(q[None], k)
                us.append((time.thread_time_ns() - t0) / 1e3)
                found.append(len(set(ids[0].tolist()) & set(ex.tolist())) / 10)
            print(f"| {len(reg):,} | {name} | {built:.1f} s | {np.median(us):.0f} µs | "
                  f"{np.mean(found):.3f} |", flush=True)


if __name__ == "__main__":
    main()
