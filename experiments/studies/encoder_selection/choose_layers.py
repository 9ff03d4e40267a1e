"""Which MiniLM layers a shallower student keeps (encoder_training.layers), chosen without the held-out folds.

    # the 3-, 2- and 4-layer cuts tried, then three cuts with their single-text int8 encode times
    python -m experiments.studies.encoder_selection.choose_layers --cuts 0,2,4 1,3,5 0,1,2 0,1,5 3,4,5
    python -m experiments.studies.encoder_selection.choose_layers --cuts 0,5 1,5 0,1 1,4 4,5 2,5
    python -m experiments.studies.encoder_selection.choose_layers \
        --cuts 0,1,4,5 0,1,2,5 0,2,4,5 2,3,4,5 1,2,4,5 0,3,4,5 0,1,3,5
    python -m experiments.studies.encoder_selection.choose_layers --cuts all 0,1,5 4,5 --latency

For each cut: MiniLM cut to those layers (:func:`tracer.learn.encoders.student.keep_layers`, *not*
fine-tuned), plain vector search over the registry's tool texts for every pair of outer fold F's *training*
split (the pairs encoder_training=mnrl fine-tunes on: tracer_plus's query rendering, the gold tool's
``search_text``), recall@5. The cut that keeps most of the full model's zero-shot ranking is the one
fine-tuned (``layers`` of tracer/configs/encoder_training/mnrl_l3_int8.yaml;
experiments/configs/encoder_training/mnrl_l4_int8.yaml, mnrl_l2_int8.yaml). ``--latency`` also exports each
cut to ONNX int8 (``tracer.encode.onnx``, into a temporary folder) and times one-text encodes of 300 of those
query texts on one thread, the cuts in alternating blocks of 25 texts: the median, and the texts' median
length in word pieces. ``--base``: cut from this checkpoint instead of MiniLM (e.g. the fold's fine-tuned
encoder, as ``from_teacher`` does; the encode time depends on the shape alone).
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
from sentence_transformers import SentenceTransformer

from tracer.build import build_dataset, build_fold_encoders
from tracer.core.folds import kfold
from tracer.encode.embedders import minilm_path
from tracer.learn.encoders.student import keep_layers


def cut_model(layers: tuple[int, ...] | None, base: str | None = None) -> SentenceTransformer:
    model = SentenceTransformer(str(base or minilm_path()), device="cpu")
    if layers is not None:
        keep_layers(model, layers)
    return model


def int8_embedder(model: SentenceTransformer, work: Path):
    """The cut model's ONNX int8 export (a fresh one per model), run on one thread."""
    from tracer.encode.onnx import OnnxEmbedder

    folder = work / f"cut-{time.monotonic_ns()}"
    model.save(str(folder))
    return OnnxEmbedder(folder, "int8", encoder_dir=work / "exports", threads=1)


def interleaved_encode_ms(embedders: list, texts: list[str], block: int = 25) -> list[float]:
    """Median wall ms of a one-text encode per embedder, timed in alternating blocks of ``block`` texts (each
    block's first encode re-warms the model, untimed; the order rotates), so that drift of the host hits every
    model alike."""
    times: list[list[float]] = [[] for _ in embedders]
    for j, b in enumerate(range(0, len(texts), block)):
        for i in [(j + r) % len(embedders) for r in range(len(embedders))]:
            embedders[i].encode([texts[b]])
            for t in texts[b: b + block]:
                t0 = time.perf_counter()
                embedders[i].encode([t])
                times[i].append((time.perf_counter() - t0) * 1e3)
    return [float(np.median(t)) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuts", nargs="+", required=True,
                    help="comma-separated layer indices per cut, or 'all'")
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--base", default=None, help="a checkpoint to cut from (default: the bundled MiniLM)")
    a = ap.parse_args()
    cuts = [None if c == "all" else tuple(int(i) for i in c.split(",")) for c in a.cuts]
    torch.set_num_threads(1 if a.latency else torch.get_num_threads())
    ds = build_dataset("bfcl", "large", 0)
    # evaluate.py's outer split; its test side is never read
    train = kfold(ds.trajectories, 5, 0)[a.fold].train
    pairs = build_fold_encoders(ds.registry, "mnrl", seed=0).pairs(train)
    tools = [t.search_text for t in ds.registry]
    gold = torch.tensor([tools.index(p) for p in pairs.positives])                          # [P]
    queries = list(dict.fromkeys(pairs.anchors))[:300]
    if a.latency:
        tok = cut_model(None).tokenizer
        print(
            f"query texts: median {int(np.median([len(tok(t)['input_ids']) for t in queries]))} word pieces")
    with tempfile.TemporaryDirectory() as work:
        lines, embedders = [], []
        for layers in cuts:
            model = cut_model(layers, a.base)
            q = model.encode(list(pairs.anchors), convert_to_tensor=True, normalize_embeddings=True)  # [P, d]
            t = model.encode(tools, convert_to_tensor=True, normalize_embeddings=True)                # [N, d]
            top = (q @ t.T).topk(5, dim=1).indices                                                    # [P, 5]
            lines.append(f"layers {'all' if layers is None else list(layers)}: "
                         f"{'zero-shot' if a.base is None else 'cut, not fine-tuned again:'} recall@5 "
                         f"{(top == gold[:, None]).any(1).float().mean():.3f} on {len(pairs)} training pairs")
            print(lines[-1], flush=True)
            if a.latency:
                embedders.append(int8_embedder(model, Path(work)))
        if a.latency:
            for line, ms in zip(lines, interleaved_encode_ms(embedders, queries)):
                print(f"{line}, int8 one-text encode p50 {ms:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
