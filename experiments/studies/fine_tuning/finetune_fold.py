"""Fine-tune the encoder on one outer fold's training trajectories (BFCL), cached; prints the checkpoint.

    python scripts/finetune_fold.py [--dataset bfcl] [--registry large] [--fold 0] [--folds 5] [--seed 0]

The folds are evaluate.py's (tracer.core.folds.kfold on the groups, same seed), the pairs are
the encoder_training config's (tracer_plus's query rendering, Tool.search_text); a second run
with the same data and recipe finds the checkpoint and does not train. With ``negatives: trie`` it also
counts where the pairs' hard negatives come from.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from omegaconf import OmegaConf

from tracer.build import build_dataset, load_config
from tracer.core.folds import kfold
from tracer.eval.fold_encoders import FoldEncoders
from tracer.learn.encoder import print_progress, train_info
from tracer.learn.pairs import trie_children
from tracer.scoring.resources import training_steps


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
    enc = FoldEncoders(ds.registry, OmegaConf.to_container(load_config("encoder_training", a.config, seed=a.seed)))
    path = enc.checkpoint(enc.pairs(train), log=print_progress())
    info = train_info(path)
    out = {"checkpoint": str(path), "pairs": info["pairs"], "batches": info["batches"],
           "train_seconds": info["train_seconds"], "first_loss": info["loss"][0], "last_loss": info["loss"][-1]}
    if enc.negatives == "trie":  # where the hard negatives come from (docs/encoders.md quotes fold 0's)
        steps = training_steps(train, ds.registry, enc.successful_only)
        children = trie_children(steps)
        at_root = sum(not s.prefix for s in steps)
        fallback = sum(len(children[s.prefix]) < 2 for s in steps)
        out["hard_negatives"] = {"pairs_at_a_turns_first_call": at_root,
                                 "pairs_later_with_another_child": len(steps) - at_root - fallback,
                                 "pairs_with_a_random_registry_tool": fallback}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
