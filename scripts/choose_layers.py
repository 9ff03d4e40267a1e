"""Which MiniLM layers a shallower student keeps (encoder_training.layers), chosen without the held-out folds.

    python scripts/choose_layers.py --cuts 0,2,4 1,3,5 0,1,2 0,1,5 3,4,5          # the 3-layer cuts tried
    python scripts/choose_layers.py --cuts 0,5 1,5 0,1 1,4 4,5 2,5                 # the 2-layer cuts tried
    python scripts/choose_layers.py --cuts 0,1,4,5 0,1,2,5 0,2,4,5 2,3,4,5 1,2,4,5 0,3,4,5 0,1,3,5   # 4 layers
    python scripts/choose_layers.py --cuts all 0,1,5 4,5 --latency                 # + single-text int8 encode

For each cut: MiniLM cut to those layers (``tracer.learn.student.keep_layers``, *not* fine-tuned), plain
vector search over the registry's tool texts for every pair of outer fold F's *training* split (the pairs
encoder_training=mnrl fine-tunes on: tracer_plus's query rendering, the gold tool's ``search_text``),
recall@5. The cut that keeps most of the full model's zero-shot ranking is the one fine-tuned
(tracer/configs/encoder_training/mnrl_l4_int8.yaml, mnrl_l3_int8.yaml, mnrl_l2_int8.yaml quote this output). ``--latency`` also
exports each cut to ONNX int8 (``tracer.encode.onnx``, into a temporary folder) and times one-text encodes of
300 of those query texts on one thread: the median, and the texts' median length in word pieces.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
from omegaconf import OmegaConf
from sentence_transformers import SentenceTransformer

from tracer.build import build_dataset, load_config
from tracer.core.folds import kfold
from tracer.encode.embedders import minilm_path
from tracer.eval.fold_encoders import FoldEncoders
from tracer.learn.student import keep_layers


def cut_model(layers: tuple[int, ...] | None) -> SentenceTransformer:
    model = SentenceTransformer(str(minilm_path()), device="cpu")
    if layers is not None:
        keep_layers(model, layers)
    return model


def int8_encode_ms(model: SentenceTransformer, texts: list[str], work: Path) -> float:
    """Median wall ms of a one-text encode through the cut model's ONNX int8 export, one thread."""
    from tracer.encode.onnx import OnnxEmbedder

    folder = work / f"cut-{len(model[0].auto_model.encoder.layer)}-{time.monotonic_ns()}"
    model.save(str(folder))
    emb = OnnxEmbedder(folder, "int8", encoder_dir=work / "exports", threads=1)
    for t in texts[:30]:  # warm-up
        emb.encode([t])
    times = []
    for t in texts:
        t0 = time.perf_counter()
        emb.encode([t])
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuts", nargs="+", required=True, help="comma-separated layer indices per cut, or 'all'")
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--latency", action="store_true")
    a = ap.parse_args()
    cuts = [None if c == "all" else tuple(int(i) for i in c.split(",")) for c in a.cuts]
    torch.set_num_threads(1 if a.latency else torch.get_num_threads())
    ds = build_dataset("bfcl", "large", 0)
    train = kfold(ds.trajectories, 5, 0)[a.fold].train  # evaluate.py's outer split; its test side is never read
    pairs = FoldEncoders(ds.registry, OmegaConf.to_container(load_config("encoder_training", "mnrl", seed=0))).pairs(train)
    tools = [t.search_text for t in ds.registry]
    gold = torch.tensor([tools.index(p) for p in pairs.positives])                          # [P]
    queries = list(dict.fromkeys(pairs.anchors))[:300]
    if a.latency:
        tok = cut_model(None).tokenizer
        print(f"query texts: median {int(np.median([len(tok(t)['input_ids']) for t in queries]))} word pieces")
    with tempfile.TemporaryDirectory() as work:
        for layers in cuts:
            model = cut_model(layers)
            q = model.encode(list(pairs.anchors), convert_to_tensor=True, normalize_embeddings=True)  # [P, d]
            t = model.encode(tools, convert_to_tensor=True, normalize_embeddings=True)                # [N, d]
            top = (q @ t.T).topk(5, dim=1).indices                                                    # [P, 5]
            line = f"layers {'all' if layers is None else list(layers)}: zero-shot recall@5 " \
                   f"{(top == gold[:, None]).any(1).float().mean():.3f} on {len(pairs)} training pairs"
            if a.latency:
                line += f", int8 one-text encode p50 {int8_encode_ms(model, queries, Path(work)):.2f} ms"
            print(line, flush=True)


if __name__ == "__main__":
    main()
