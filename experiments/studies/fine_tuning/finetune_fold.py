"""Fine-tune the encoder on one outer fold's training trajectories (BFCL), cached; prints the checkpoint.

    python -m experiments.studies.fine_tuning.finetune_fold [--dataset bfcl] [--registry large] [--fold 0]
        [--folds 5] [--seed 0] [--config mnrl]

The folds are evaluate.py's (tracer.core.folds.kfold on the groups, same seed), the pairs are
the encoder_training config's (tracer_plus's query rendering, Tool.search_text); a second run
with the same data and recipe finds the checkpoint and does not train.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tracer.build import build_dataset, build_fold_encoders
from tracer.core.folds import kfold
from tracer.learn.encoders import train_info
from tracer.learn.encoders.transformer import print_progress


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="bfcl")
    ap.add_argument("--registry", default="large")
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default="mnrl", help="a recipe in tracer/configs/encoder_training/")
    a = ap.parse_args()
    ds = build_dataset(a.dataset, a.registry, a.seed)
    train = kfold(ds.trajectories, a.folds, a.seed)[a.fold].train  # evaluate.py's outer split
    enc = build_fold_encoders(ds.registry, a.config, seed=a.seed)
    path = enc.checkpoint(enc.pairs(train), log=print_progress())
    info = train_info(path)
    out = {"checkpoint": str(path), "pairs": info["pairs"], "batches": info["batches"],
           "train_seconds": info["train_seconds"], "first_loss": info["loss"][0],
           "last_loss": info["loss"][-1]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
