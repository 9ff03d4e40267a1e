"""A transformer recipe's variants scored inside tracer_plus, without looking at any held-out fold.

    python -m experiments.studies.encoder_selection.select_student --fold 0 --recipe mnrl_l3_cut_int8 \
        --variant base='{}' lr1e-4='{"lr": 1e-4}' contexts05='{"context_weight": 0.5}' \
        [--out results/encoders/select_student_bfcl_fold0_l3.json]

The transformer counterpart of ``select_static --scorer tracer_plus``. Inside outer fold ``--fold``'s training
trajectories only, 20 % of the groups (seeded, :func:`experiments.common.validation_groups`) are set aside;
each variant (``--recipe``'s encoder_training config updated with a JSON object of its fields) is fine-tuned
on the other 80 % (``FoldEncoders.checkpoint``, cached by content hash; a student cut from its teacher finds
or trains the teacher on the same 80 %), served in ONNX int8, and scored on the set-aside steps twice: plain
vector search, and tracer_plus fitted on the 80 % under it (shared inner folds, as the fast preset),
teacher-forced at k = 5. The outer fold's held-out trajectories are never read. Each variant's row is printed
as it ends (training seconds from the checkpoint's ``train_info.json``: the first run's, a cached one keeps
them).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from experiments.common import inner_split, split_arguments, write_out
from tracer.build import build_fold_encoders, build_scorer, load_config, plain
from tracer.core.steps import extract_all
from tracer.encode.embedders import CachedEmbedder
from tracer.encode.onnx import OnnxEmbedder
from tracer.eval.metrics import teacher_forced_outcomes
from tracer.learn.encoders import train_info
from tracer.scorer_base.resources import Resources


def variant(text: str) -> tuple[str, dict]:
    label, sep, fields = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected LABEL='{{json fields}}'")
    try:
        over = json.loads(fields)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--variant {label}: its fields are not JSON ({e})") from e
    if not isinstance(over, dict):
        raise argparse.ArgumentTypeError(
            f"--variant {label}: its fields must be a JSON object, got {fields!r}")
    return label, over


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    split_arguments(ap)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--recipe", default="mnrl_l3_cut_int8", help="a transformer encoder_training config")
    ap.add_argument("--variant", nargs="+", type=variant, default=[("base", {})], metavar="LABEL=JSON")
    ap.add_argument("--embed-cache", default=".cache/embeddings")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    recipe = plain(load_config("encoder_training", a.recipe, seed=a.seed))
    ds, train, val_groups = inner_split(a)
    for label, over in a.variant:  # every variant's recipe is checked (EncoderRecipe) before any training
        try:
            kind = build_fold_encoders(ds.registry, recipe | over).recipe.kind
        except (TypeError, ValueError) as e:  # an unknown field, a bad value
            ap.error(f"--variant {label}: {e}")
        if kind != "transformer":
            ap.error(
                f"--variant {label}: kind {kind!r}; this script serves transformer checkpoints in ONNX int8")
    fit = [t for t in train if t.group not in val_groups]
    steps = [s for s in extract_all(t for t in train if t.group in val_groups and t.success)
             if s.gold in ds.registry]
    rows = []
    for label, over in a.variant:
        enc = build_fold_encoders(ds.registry, recipe | over)
        path = enc.checkpoint(enc.pairs(fit))
        res = Resources.build(ds.registry, CachedEmbedder(OnnxEmbedder(path, "int8"), a.embed_cache),
                              device="cpu")
        row = {"variant": label, "fields": over, "checkpoint": str(path),
               "train_seconds": train_info(path)["train_seconds"]}
        for name in ("vector", "tracer_plus"):
            scorer = build_scorer(name)
            scorer.fit(fit, res)
            row[name] = {m: round(float(np.mean(v)), 4)
                         for m, v in teacher_forced_outcomes(scorer, steps, a.k).items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_out(a.out, {"dataset": a.dataset, "registry": a.registry, "outer_fold": a.fold, "seed": a.seed,
                      "recipe": a.recipe, "validation_groups": len(val_groups),
                      "validation_steps": len(steps), "rows": rows})


if __name__ == "__main__":
    main()
