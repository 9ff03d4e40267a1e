"""Fine-tune one encoder on every trajectory of some datasets, for a dataset it never saw (the cold start).

    python -m experiments.studies.fine_tuning.finetune_transfer --train bfcl tau2  # then evaluate on apibank:
    python evaluate.py dataset=apibank embedder=finetuned embedder.model=<printed folder> scorer=vector

The pairs are each dataset's own (its registry's tool texts, the encoder_training recipe's context
rendering), concatenated in the order given; the checkpoint is cached by their content hash like a
per-fold one (``tracer.learn.encoder.finetuned``), so a rerun does not train. Every fold of the target
dataset may then be read: none of its trajectories reached the encoder.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tracer.build import build_dataset, build_fold_encoders, load_config, plain
from tracer.learn.encoders import Pairs, finetuned, train_info
from tracer.learn.encoders.transformer import print_progress


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", nargs="+", required=True, help="loader names: bfcl, tau2, apibank")
    ap.add_argument("--registry", default="large")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default="mnrl", help="a recipe in tracer/configs/encoder_training/")
    a = ap.parse_args()
    cfg = plain(load_config("encoder_training", a.config, seed=a.seed))
    parts, enc = [], None
    for name in a.train:
        ds = build_dataset(name, a.registry, a.seed)
        enc = build_fold_encoders(ds.registry, cfg)
        parts.append(enc.pairs(ds.trajectories))
    pairs = Pairs.cat(parts)
    r = enc.recipe
    path = finetuned(pairs, r.train, r.base_model, r.encoder_dir, r.device, log=print_progress())
    info = train_info(path)
    print(json.dumps({"checkpoint": str(path), "datasets": a.train, "pairs": [len(p) for p in parts],
                      "batches": info["batches"], "train_seconds": info["train_seconds"],
                      "first_loss": info["loss"][0], "last_loss": info["loss"][-1]}))


if __name__ == "__main__":
    main()
