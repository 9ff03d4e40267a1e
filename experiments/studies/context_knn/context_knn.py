"""How well an encoder's context-to-context similarity finds the next tool: nearest-context accuracy on one
fold.

    python -m experiments.studies.context_knn.context_knn --teacher .cache/encoders/finetuned-<fold 0, mnrl> \
        --student LABEL=.cache/encoders/finetuned-<fold 0 student> [LABEL=... ...] [--fold 0] \
        [--out results/encoders/context_knn_bfcl_fold0.json]

tracer_plus's edge memories compare a live context with the contexts stored at a trie state; this measures
that similarity alone. BFCL (registry large), outer fold F of evaluate.py's 5 folds: every held-out step's
context (tracer_plus's query rendering) is compared with every training step's (successful trajectories),
and the accuracy is the share of held-out steps whose most similar training context had the same gold tool.
Pairs ``live -> stored``: each encoder against itself, and each student's live contexts against the teacher's
stored ones (what storing the teacher's vectors beside a query student would give). Students in ONNX int8 as
they are served; the teacher (fold F's ``mnrl`` checkpoint) in torch.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from tracer.build import build_dataset, build_embedder, load_config, plain
from tracer.core.context import ContextRendering
from tracer.core.folds import kfold
from tracer.core.steps import extract_all
from tracer.scorer_base.resources import training_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True, help="fold F's mnrl checkpoint (torch)")
    ap.add_argument("--student", nargs="+", required=True, metavar="LABEL=CHECKPOINT",
                    help="served in ONNX int8")
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--out", default="results/encoders/context_knn_bfcl_fold0.json")
    a = ap.parse_args()
    ds = build_dataset("bfcl", "large")
    split = kfold(ds.trajectories, 5, 0)[a.fold]  # evaluate.py's outer split
    train = training_steps(split.train, ds.registry)
    test = [s for s in extract_all(split.test) if s.gold in ds.registry]
    # the anchors' rendering of the encoder recipes (tracer_plus's query)
    rendering = ContextRendering.from_config(
        plain(load_config("encoder_training", "mnrl", seed=0))["context"])
    texts = [rendering.render(s.context) for s in train], [rendering.render(s.context) for s in test]
    gold_train, gold_test = np.array([s.gold for s in train]), np.array([s.gold for s in test])
    encoders = {"teacher": build_embedder("finetuned", model=a.teacher)}
    for spec in a.student:
        label, path = spec.split("=", 1)
        encoders[label] = build_embedder("onnx_int8", model=path)
    # [S, d], [T, d]
    vecs = {label: (e.encode(texts[0]), e.encode(texts[1])) for label, e in encoders.items()}
    pairs = [(label, label) for label in encoders] + [(label, "teacher")
                                                      for label in encoders if label != "teacher"]
    out = {}
    for live, stored in pairs:
        nearest = (vecs[live][1] @ vecs[stored][0].T).argmax(1).numpy()                         # [T]
        out[f"{live} -> {stored}"] = float((gold_train[nearest] == gold_test).mean())
        print(f"{live} -> {stored}: {out[f'{live} -> {stored}']:.4f}", flush=True)
    Path(a.out).write_text(json.dumps({"fold": a.fold, "held_out_steps": len(test),
                                       "training_steps": len(train), "teacher": a.teacher,
                                       "students": a.student, "accuracy": out}, indent=1))


if __name__ == "__main__":
    main()
