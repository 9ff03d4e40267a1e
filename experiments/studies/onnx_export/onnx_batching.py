"""Why the ONNX embedders run one text at a time: int8 vectors that depend on their batch, and padding's cost.

    OMP_NUM_THREADS=1 python -m experiments.studies.onnx_export.onnx_batching \
        [--model .cache/encoders/finetuned-<a checkpoint> ...]
        [--n 512] [--batch 64]

``--n`` distinct BFCL contexts (registry large, every trajectory; tracer_plus's query rendering, a seeded
sample) encoded by each model's ONNX export (``tracer.encode.onnx``, one thread) with ``batch_size``
``--batch`` and 1: texts per second each way, and how far each batched vector is from the same text encoded
alone (cosine, mean and minimum; fp32 as the control, whose vectors do not move). Dynamic int8 quantisation
takes one activation scale per tensor, i.e. per padded batch, so a text's int8 vector moves with the texts it
is batched with.
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


from tracer.build import build_dataset, build_scorer
from tracer.core.steps import extract_all
from tracer.core.threads import machine
from tracer.encode.onnx import OnnxEmbedder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="*", default=[], help="checkpoint folders beside the bundled MiniLM")
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    ds = build_dataset("bfcl", "large")
    rendering = build_scorer("tracer_plus").rendering
    texts = sorted({rendering.render(s.context) for s in extract_all(ds.trajectories)})
    random.Random(0).shuffle(texts)
    texts = texts[: a.n]
    print(f"{len(texts)} BFCL contexts, one thread; {machine()}\n")
    print(f"| model | variant | texts/s, batches of {a.batch} | texts/s, one at a time | cosine batched vs "
          "alone, mean / min |")
    print("|---|---|---:|---:|---:|")
    for model in [None, *a.model]:
        for variant in ("fp32", "int8"):
            rows = {}
            for batch in (a.batch, 1):
                emb = OnnxEmbedder(model, variant, batch_size=batch)
                emb.encode(texts[:8])  # warm
                t0 = time.perf_counter()
                rows[batch] = (emb.encode(texts).numpy(), len(texts) / (time.perf_counter() - t0))  # [N, d]
            cos = (rows[a.batch][0] * rows[1][0]).sum(1)                                          # [N]
            print(f"| {model or 'all-MiniLM-L6-v2'} | {variant} | {rows[a.batch][1]:.0f} | {rows[1][1]:.0f} "
                  f"| {cos.mean():.4f} / {cos.min():.4f} |", flush=True)


if __name__ == "__main__":
    main()
