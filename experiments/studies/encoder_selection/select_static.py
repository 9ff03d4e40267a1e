"""Choose the trained static encoder's recipe without looking at any held-out fold.

    python -m experiments.studies.encoder_selection.select_static [--dataset bfcl] [--fold 0]
        [--scorer vector|tracer_plus] [--tool-text search|params|params_desc] [--recipes LABEL ...]
        [--out results/encoders/select_static_bfcl_fold0.json]

Inside outer fold ``--fold``'s training trajectories only, 20 % of the groups (seeded) are set aside as a
validation split; each recipe of ``RECIPES`` trains on the other 80 % (:func:`tracer.learn.encoders.static.
train_static`, the pairs of ``encoder_training=static_mnrl``, whose recipe is the row chosen here) and is
scored by plain vector search on the validation steps: each rendered context against every registry tool's
text, recall@1/@5 and MRR. The outer fold's held-out trajectories are never read. The zero-shot distillation
is the first row. ``--tool-text params`` / ``params_desc`` appends the parameters' names (and descriptions) to
each tool's text, in training and in ranking alike: the question whether the embedded tool text should carry
them.

``--scorer tracer_plus`` scores each recipe where the fast preset uses it instead: tracer_plus fitted on the
80 % (its candidate model's inner folds each under a static encoder trained without them, as ``inner_encoders:
true``; ``--inner shared`` lets them share the table), teacher-forced on the validation steps at k = 5. Vector
recall is the wrong proxy for that: negatives over the whole registry won it and lost inside tracer_plus
(experiments/studies/encoder_selection/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
from model2vec import StaticModel

from experiments.common import TOOL_TEXTS, inner_split, ranking_metrics, retext, split_arguments, write_out
from tracer.build import build_fold_encoders, build_scorer, load_config, plain
from tracer.core.steps import extract_all
from tracer.encode.static import distilled
from tracer.eval.metrics import teacher_forced_outcomes
from tracer.learn.encoders.static import encode, train_static

# (label, overrides of BASE); BASE is the first recipe tried. Every row ranks each context over the batch's
# tool texts (in-batch negatives); the rows with negatives over the whole registry ran with the code they
# needed (experiments/studies/encoder_selection/README.md)
BASE = {"batch_size": 64, "lr": 5e-3, "epochs": 1, "scale": 20.0}
RECIPES = [
    ("in-batch, 1 epoch", {}),
    ("in-batch, 3 epochs", {"epochs": 3}),
    ("in-batch, lr 1e-2", {"lr": 1e-2}),
    ("in-batch, lr 2e-3", {"lr": 2e-3}),
    ("in-batch, 2 epochs", {"epochs": 2}),
    ("in-batch, 5 epochs", {"epochs": 5}),
    ("in-batch, 3 epochs + contexts 0.5", {"epochs": 3, "context_weight": 0.5}),
    ("in-batch, scale 30", {"scale": 30.0}),
    ("in-batch, scale 50", {"scale": 50.0}),
    ("in-batch, batch 32", {"batch_size": 32}),
    ("in-batch, batch 128", {"batch_size": 128}),
    # tracer_plus's own settings beside the encoder's (--scorer tracer_plus only)
    ("in-batch, mlp", {"scorer": {"model": "mlp"}}),
    ("in-batch, 2 epochs, mlp", {"epochs": 2, "scorer": {"model": "mlp"}}),
    ("in-batch, vector top 20", {"scorer": {"vector_candidates": 20}}),
    ("in-batch, batch 32, 2 epochs", {"batch_size": 32, "epochs": 2}),
    ("in-batch + contexts 0.5", {"context_weight": 0.5}),
    ("in-batch + contexts 1", {"context_weight": 1.0}),
    ("in-batch + contexts 1, 2 epochs", {"context_weight": 1.0, "epochs": 2}),
    ("in-batch + contexts 1, 3 epochs", {"context_weight": 1.0, "epochs": 3}),
]


def vector_metrics(table: torch.Tensor, model: StaticModel, anchors, golds, tools, max_tokens: int) -> dict:
    with torch.no_grad():
        q = encode(table, model, anchors, max_tokens)                       # [S, d]
        t = encode(table, model, tools, max_tokens)                         # [N, d]
    return ranking_metrics((q @ t.T).numpy(), golds, tools)                 # [S, N] cosines


def tracer_plus_metrics(registry, cfg: dict, fit, val, k: int, scorer_overrides: dict | None = None,
                        clean_inner: bool = True) -> dict:
    """tracer_plus (its config with ``scorer_overrides``) fitted on ``fit`` (trajectories) with a static
    encoder of recipe ``cfg`` trained on them, its inner folds clean (``clean_inner``) or sharing it, scored
    on the successful ``val`` trajectories' steps."""
    res = build_fold_encoders(registry, cfg | {"inner_encoders": clean_inner})(fit)
    steps = [s for s in extract_all(t for t in val if t.success) if s.gold in registry]
    scorer = build_scorer("tracer_plus", **(scorer_overrides or {}))
    scorer.fit(fit, res)
    per_step = {m: round(sum(v) / len(v), 4) for m, v in teacher_forced_outcomes(scorer, steps, k).items()}
    return per_step | {"steps": len(steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    split_arguments(ap)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tool-text", choices=tuple(TOOL_TEXTS), default="search",
                    help="the tool text trained and ranked (search: Tool.search_text, "
                         "what the scorers embed)")
    ap.add_argument("--recipes", nargs="+", default=None, help="labels of RECIPES to run (default: all)")
    ap.add_argument("--scorer", choices=("vector", "tracer_plus"), default="vector",
                    help="what scores a recipe on the validation split: plain vector search, or tracer_plus")
    ap.add_argument("--inner", choices=("clean", "shared"), default="clean",
                    help="tracer_plus's inner folds: each under an encoder trained without it, "
                         "or sharing one")
    a = ap.parse_args()
    if a.scorer == "tracer_plus" and a.tool_text != "search":
        ap.error("--scorer tracer_plus ranks the registry's own tool text; --tool-text must stay search")
    torch.set_num_threads(1)
    ds, train, val_groups = inner_split(a)
    cfg = plain(load_config("encoder_training", "static_mnrl", seed=a.seed))
    enc = build_fold_encoders(ds.registry, cfg)
    text = {t.search_text: TOOL_TEXTS[a.tool_text](t) for t in ds.registry}
    fit = retext(enc.pairs([t for t in train if t.group not in val_groups]), text)
    val = retext(enc.pairs([t for t in train if t.group in val_groups]), text)
    tools = [text[t.search_text] for t in ds.registry]
    if a.scorer == "tracer_plus":
        fit_t = [t for t in train if t.group not in val_groups]
        val_t = [t for t in train if t.group in val_groups]
        rows = []
        for label, over in RECIPES:
            if a.recipes is not None and label not in a.recipes:
                continue
            t0 = time.perf_counter()
            over = dict(over)
            scorer_overrides = over.pop("scorer", None)
            rows.append({"recipe": label, "seconds": 0.0,
                         **tracer_plus_metrics(ds.registry, cfg | BASE | over, fit_t, val_t, 5,
                                               scorer_overrides, a.inner == "clean")})
            rows[-1]["seconds"] = round(time.perf_counter() - t0, 1)
            print(json.dumps(rows[-1]), flush=True)
        write_out(a.out, {"dataset": a.dataset, "registry": a.registry, "outer_fold": a.fold, "seed": a.seed,
                          "scorer": "tracer_plus", "config": "static_mnrl", "inner": a.inner,
                          "fit_pairs": len(fit),
                          "validation_groups": len(val_groups),
                          "rows": rows})
        return
    r = enc.recipe
    base = StaticModel.from_pretrained(str(distilled(r.base_model, r.pca_dims, r.encoder_dir) / "model"))
    zero = torch.tensor(np.asarray(base.embedding, dtype=np.float32))
    rows = [{"recipe": "zero-shot distillation", "train_seconds": 0.0,
             **vector_metrics(zero, base, val.anchors, val.positives, tools, r.train.max_seq_length)}]
    print(json.dumps(rows[-1]), flush=True)
    for label, over in RECIPES:
        if (a.recipes is not None and label not in a.recipes) or (a.recipes is None and "scorer" in over):
            continue
        recipe = replace(r.train, **{**BASE, **over})  # the context term's weight is a field of the recipe
        t0 = time.perf_counter()
        table, _ = train_static(fit, recipe, base)
        rows.append({"recipe": label, "train_seconds": round(time.perf_counter() - t0, 1),
                     **vector_metrics(torch.from_numpy(table), base, val.anchors, val.positives, tools,
                                      recipe.max_seq_length)})
        print(json.dumps(rows[-1]), flush=True)
    write_out(a.out, {"dataset": a.dataset, "registry": a.registry, "outer_fold": a.fold, "seed": a.seed,
                      "tool_text": a.tool_text, "fit_pairs": len(fit), "validation_pairs": len(val),
                      "validation_groups": len(val_groups), "rows": rows})


if __name__ == "__main__":
    main()
