"""End-to-end latency of a live step for every encoder x scorer, measured in one run (the frontier's speed
axis).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_frontier \
        [--finetuned .cache/encoders/finetuned-<fold 0 hash>]
        [--student .cache/encoders/finetuned-<fold 0's 3-layer student> ...]
        [--named "LABEL=.cache/encoders/finetuned-<another fold 0 checkpoint>" ...] [--cascade]
        [--n 300] [--only LABEL ...] [--out results/encoders/frontier_latency.json]

BFCL (registry large), each scorer fitted on outer fold 0's training split (5 folds by group, seed 0)
with each encoder; then, for ``n`` held-out steps in a seeded order, ``Retriever.select_ids(messages)``:
the message check, the context rendered and encoded (the embedding cache bypassed), the scorer's live
path, k = 5. Round-robin per step over every (encoder, scorer) in a rotating order, so a burst of load
from other processes hits all of them alike. Then the same steps again in blocks (``--block`` consecutive
steps of one encoder x scorer, the blocks rotating likewise): a server runs one encoder for request after
request, so its weights stay in the CPU caches, while interleaving a dozen models step by step evicts
each one's between its steps. The first is the pessimistic figure, the second the serving one (both are
reported; docs/encoders.md compares them). One torch thread, ONNX Runtime with one intra-op thread.
Per encoder also: single-text encode p50 (round-robin in the same loop; the ratio to MiniLM torch is the
figure to compare across machines) and throughput (texts/s, ``encode`` given lists of 64; the ONNX embedders
run each text of a list alone, ``OnnxEmbedder.batch_size``, the others as one batch).

Always included: fold 0's static model trained on its training split (``encoder_training=static_mnrl``).
``--finetuned`` adds the fold-0 checkpoint (``python -m experiments.studies.fine_tuning.finetune_fold --fold
0``; trained on fold 0's training split only, so fold 0's held-out steps are fair), its static distillation
and its ONNX int8 export; ``--student`` fold 0's shallower students (``encoder_training=mnrl_l3_int8``) in
ONNX int8; ``--named`` any other fold 0 checkpoints in ONNX int8 under the given labels (e.g. a second 3-layer
student, ``encoder_training=mnrl_l3_cut_int8``); ``--cascade`` the cascade (``scorer=cascade
encoder_training=cascade``: fold 0's trained static encoder for every step, fold 0's fine-tuned encoder in
ONNX int8 for the steps the fast stage is unsure of; both encoders live, the share of the timed steps that
escalated reported beside it, and the mean step, which the cascade's p50 hides). Wall-clock and thread-CPU
milliseconds are both reported: the CPU figure is what load on a shared machine inflates least.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import torch

from tracer.build import build_dataset, build_embedder, build_fold_encoders, build_scorer
from tracer.core.folds import assign_folds
from tracer.core.steps import extract_all
from tracer.core.threads import machine, one_thread
from tracer.retriever import Retriever
from tracer.scorer_base.resources import Resources

CASCADE = "cascade: trained static, then fine-tuned ONNX int8"


def encoders(finetuned: str | None, trained_static: str, students: dict[int, str] | None = None,
             named: dict[str, str] | None = None) -> dict[str, tuple]:
    """label -> (embedder config name or config, overrides)."""
    out = {"MiniLM torch": ("minilm", {}), "ONNX fp32": ("onnx_fp32", {}), "ONNX int8": ("onnx_int8", {}),
           "static m2v": ("static", {}), "trained static m2v": ("static", {"model": trained_static})}
    if finetuned:
        out |= {"fine-tuned torch": ("finetuned", {"model": finetuned}),
                "fine-tuned ONNX int8": ("onnx_int8", {"model": finetuned}),
                "fine-tuned static m2v": ("static", {"model": finetuned})}
    for layers, path in sorted((students or {}).items(), reverse=True):
        out[f"{layers}-layer fine-tuned ONNX int8"] = ("onnx_int8", {"model": path})
    for label, path in (named or {}).items():
        out[label] = ("onnx_int8", {"model": path})
    return out


def layer_count(checkpoint: str) -> int:
    return int(json.loads((Path(checkpoint) / "config.json").read_text())["num_hidden_layers"])


def pct(v: list[float], q: float) -> float:
    return float(np.percentile(v, q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--finetuned", default=None, help="fold 0's fine-tuned checkpoint folder")
    ap.add_argument("--student", nargs="*", default=[],
                    help="fold 0's student checkpoints (finetune_fold --config mnrl_l3_int8 --fold 0)")
    ap.add_argument("--named", nargs="*", default=[], metavar="LABEL=CHECKPOINT",
                    help="more fold 0 checkpoints, served in ONNX int8 under these labels")
    ap.add_argument("--cascade", action="store_true",
                    help="add the cascade (encoder_training=cascade, scorer=cascade; "
                    "fold 0's teacher from finetune_fold --config mnrl --fold 0, or trained here)")
    ap.add_argument("--scorers", nargs="+", default=["vector", "tracer_plus"])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--block", type=int, default=25,
                    help="consecutive steps per encoder x scorer in the serving phase")
    ap.add_argument("--only", nargs="*", default=None, metavar="LABEL",
                    help="time only these encoders (labels as printed, e.g. '3-layer fine-tuned ONNX int8'), "
                         "beside MiniLM torch, which is always kept as the reference; "
                         "fewer models share the process")
    ap.add_argument("--out", default="results/encoders/frontier_latency.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ds = build_dataset("bfcl", "large")
    fold_of = assign_folds([t.group for t in ds.trajectories], 5, 0)
    train = [t for t in ds.trajectories if fold_of[t.group] != 0]
    test = [s for s in extract_all([t for t in ds.trajectories if fold_of[t.group] == 0])
            if s.gold in ds.registry]
    random.Random(0).shuffle(test)
    test = test[: a.n]
    # fold 0's static model trained on its training split (encoder_training=static_mnrl; seconds, cached)
    trained_static = build_fold_encoders(ds.registry, "static_mnrl", seed=0)(train).embedder.config["model"]
    retrievers, embedders = {}, {}
    chosen = encoders(a.finetuned, trained_static, {layer_count(p): p for p in a.student},
                      dict(n.split("=", 1) for n in a.named))
    if a.cascade:
        chosen[CASCADE] = None
    if a.only is not None:
        if unknown := set(a.only) - set(chosen):
            raise SystemExit(f"--only: no encoder labelled {sorted(unknown)}; the labels: {list(chosen)}")
        chosen = {label: v for label, v in chosen.items() if label == "MiniLM torch" or label in a.only}
    escalated = {}
    for label, spec in chosen.items():
        if spec is None:  # the cascade: its two encoders trained on fold 0's training split (cached)
            res = build_fold_encoders(ds.registry, "cascade", seed=0)(train)
            scorer = build_scorer("cascade")
            scorer.fit(train, res)
            # the live path's share too
            escalated[label] = float(scorer.score(test).diagnostics["escalated"].mean())
            res.embedder, res.slow.embedder = res.embedder.inner, res.slow.embedder.inner  # encode for real
            retrievers[label, "cascade"] = Retriever(scorer, a.k)
            print(f"fitted {label}: {escalated[label]:.1%} of the steps escalate", flush=True)
            continue
        name, overrides = spec
        emb = build_embedder(name, **overrides)
        res = Resources.build(ds.registry, emb, device="cpu")
        for sc in a.scorers:
            scorer = build_scorer(sc)
            scorer.fit(train, res)
            retrievers[label, sc] = Retriever(scorer, a.k)
        res.embedder = emb.inner  # every live step encodes for real (the fit above used the disk cache)
        embedders[label] = emb.inner
        print(f"fitted {label}", flush=True)
    keys = list(retrievers)
    labels = list(embedders)
    texts = [retrievers[keys[0]].scorer.rendering.render(s.context) for s in test]  # tracer_plus's query text
    wall = {key: [] for key in keys}
    cpu = {key: [] for key in keys}
    single = {label: [] for label in labels}
    with one_thread(), torch.inference_mode():
        for key in keys:  # warm-up
            for s in test[:10]:
                retrievers[key].select_ids(s.context)
        for i, s in enumerate(test):  # round-robin, the order rotating: load bursts hit every row alike
            for key in keys[i % len(keys):] + keys[: i % len(keys)]:
                t0, c0 = time.perf_counter(), time.thread_time()
                retrievers[key].select_ids(s.context)
                wall[key].append((time.perf_counter() - t0) * 1000)
                cpu[key].append((time.thread_time() - c0) * 1000)
            for label in labels[i % len(labels):] + labels[: i % len(labels)]:
                t0 = time.perf_counter()
                embedders[label].encode([texts[i]])
                single[label].append((time.perf_counter() - t0) * 1000)
        serving = {key: [] for key in keys}
        for j, b in enumerate(range(0, len(test), a.block)):  # blocks: one model warm, as in a server
            for key in keys[j % len(keys):] + keys[: j % len(keys)]:
                retrievers[key].select_ids(test[b].context)  # the block's first step re-warms it, untimed
                for s in test[b: b + a.block]:
                    t0 = time.perf_counter()
                    retrievers[key].select_ids(s.context)
                    serving[key].append((time.perf_counter() - t0) * 1000)
        base = pct(single["MiniLM torch"], 50)
        encode = {}
        for label, emb in embedders.items():
            t0 = time.perf_counter()
            for j in range(0, len(texts), 64):
                emb.encode(texts[j:j + 64])
            encode[label] = {"single_text_p50_ms": pct(single[label], 50),
                             "single_text_p95_ms": pct(single[label], 95),
                             "single_text_ratio_to_minilm": pct(single[label], 50) / base,
                             "texts_per_s_batch64": len(texts) / (time.perf_counter() - t0)}
    rows = [{"encoder": label, "scorer": sc, "steps": len(test), "e2e_p50_ms": pct(wall[label, sc], 50),
             "e2e_p95_ms": pct(wall[label, sc], 95), "e2e_mean_ms": float(np.mean(wall[label, sc])),
             "e2e_cpu_p50_ms": pct(cpu[label, sc], 50),
             "serving_p50_ms": pct(serving[label, sc], 50), "serving_p95_ms": pct(serving[label, sc], 95),
             "serving_mean_ms": float(np.mean(serving[label, sc])), **encode.get(label, {}),
             **({"escalated": escalated[label]} if label in escalated else {})}
            for label, sc in keys]
    load = os.getloadavg()[0]
    print("| encoder | scorer | step p50 / p95 ms interleaved (wall) | step p50 ms (CPU) | step p50 / p95 "
          f"ms serving (blocks of {a.block}) | single-text encode p50 ms | / MiniLM torch | texts/s (lists "
          f"of 64) |   ({len(test)} BFCL fold-0 steps, one thread, load avg {load:.2f}; {machine()})")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        enc = (f"{r['single_text_p50_ms']:.2f} | {r['single_text_ratio_to_minilm']:.3f} "
               f"| {r['texts_per_s_batch64']:.0f}"
               if "single_text_p50_ms" in r
               else f"(two encoders; {r['escalated']:.1%} of the steps escalated) | |")
        print(f"| {r['encoder']} | {r['scorer']} | {r['e2e_p50_ms']:.2f} / {r['e2e_p95_ms']:.2f} | "
              f"{r['e2e_cpu_p50_ms']:.2f} | {r['serving_p50_ms']:.2f} / {r['serving_p95_ms']:.2f} "
              f"(mean {r['serving_mean_ms']:.2f}) | {enc} |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"steps": len(test), "load_avg_1min": load, "finetuned": a.finetuned,
                                       "block": a.block,
                                       "only": a.only,
                                       "machine": machine(),
                                       "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
