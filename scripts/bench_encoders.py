"""Single-text encode latency of the encoders, one thread, measured in one run (round-robin per text).

    python scripts/bench_encoders.py [--n 200] [--out results/encoders/bench_encoders.json]

Texts are BFCL contexts rendered as tracer_plus renders its query (registry large, the first ``n``
steps in a seeded shuffle). Each text is encoded by every encoder in turn (the order rotating), so
a burst of load from other processes hits all of them alike; the ratios to MiniLM-torch are the
figures to compare across machines. One torch thread, ONNX Runtime sessions with one intra-op thread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from tracer.build import build_dataset
from tracer.core.context import ContextRendering
from tracer.core.steps import extract_all
from tracer.core.threads import one_thread
from tracer.encode.embedders import SentenceTransformerEmbedder
from tracer.encode.onnx import OnnxEmbedder
from tracer.encode.static import StaticEmbedder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", default="results/encoders/bench_encoders.json")
    a = ap.parse_args()
    ds = build_dataset("bfcl", "large")
    rendering = ContextRendering(join_users=True)
    texts = [rendering.render(s.context) for s in extract_all(ds.trajectories)]
    random.Random(0).shuffle(texts)
    texts = texts[: a.n]
    encoders = {"minilm torch": SentenceTransformerEmbedder(device="cpu", progress=0),
                "onnx fp32": OnnxEmbedder(variant="fp32", threads=1),
                "onnx int8": OnnxEmbedder(variant="int8", threads=1),
                "static m2v": StaticEmbedder()}
    names = list(encoders)
    times = {k: [] for k in names}
    with one_thread(), torch.inference_mode():
        for e in encoders.values():  # warm-up
            for t in texts[:10]:
                e.encode([t])
        for i, t in enumerate(texts):
            for k in names[i % len(names):] + names[: i % len(names)]:
                t0 = time.perf_counter()
                encoders[k].encode([t])
                times[k].append((time.perf_counter() - t0) * 1000)
    base = np.median(times["minilm torch"])
    rows = {k: {"p50_ms": float(np.percentile(v, 50)), "p95_ms": float(np.percentile(v, 95)),
                "p50_ratio_to_minilm": float(np.median(v) / base), "texts_per_s": float(1000 / np.mean(v))}
            for k, v in times.items()}
    print(f"| encoder | single-text p50 ms | p95 ms | p50 / MiniLM-torch | texts/s (one at a time) |  ({len(texts)} BFCL "
          f"queries, one thread)")
    print("|---|---|---|---|---|")
    for k, r in rows.items():
        print(f"| {k} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['p50_ratio_to_minilm']:.3f} | {r['texts_per_s']:.0f} |")
    with open(a.out, "w") as f:
        json.dump({"n_texts": len(texts), "encoders": rows}, f, indent=2)


if __name__ == "__main__":
    main()
