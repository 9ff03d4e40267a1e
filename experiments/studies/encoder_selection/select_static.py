"""Choose the trained static encoder's recipe without looking at any held-out fold.

    python scripts/select_static.py [--dataset bfcl] [--fold 0] [--out results/encoders/select_static_bfcl.json]

Inside outer fold ``--fold``'s training trajectories only, 20 % of the groups (seeded) are set aside as a
validation split; each recipe trains on the other 80 % (tracer.learn.static_encoder.train_static, the
pairs of configs/encoder_training/static_mnrl.yaml, whose recipe is the row chosen here) and is scored by plain vector search on the
validation steps: each rendered context against every registry tool's text, recall@1/@5 and MRR. The
outer fold's held-out trajectories are never read. The zero-shot distillation is the first row.
``--tool-text params`` / ``params_desc`` appends the parameters' names (and descriptions) to each tool's
text, in training and in ranking alike: the question whether the embedded tool text should carry them.

``--scorer tracer_plus`` scores each recipe where the fast preset uses it instead: tracer_plus fitted on the
80 % (its candidate model's inner folds each under a static encoder trained without them, as
``inner_encoders: true``), teacher-forced on the validation steps at k = 5. Vector recall was the wrong proxy
for that (docs/encoders.md: registry negatives win it and lose inside tracer_plus).

``--config static_query`` runs the recipes on the static *query* encoder instead (its teacher, the 6-layer
encoder, fine-tuned on the same 80 % first, then cached); ``--inner shared`` lets tracer_plus's inner folds share
the table, ``--inner clean`` trains each inner fold's table without it, beside that one teacher (as
``static_query.yaml``'s ``inner_encoders: true``). Each row then also holds plain vector search's figures under ``vector``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
from model2vec import StaticModel
from omegaconf import OmegaConf

from tracer.build import build_dataset, build_scorer, load_config
from tracer.core.folds import kfold
from tracer.core.steps import extract_all
from tracer.encode.static import distilled
from tracer.eval.fold_encoders import FoldEncoders
from tracer.eval.metrics import teacher_forced_outcomes
from tracer.learn.pairs import Pairs
from tracer.learn.static_encoder import encode, train_static

# (label, overrides of BASE, negatives over the whole registry?); BASE is the first recipe tried (in-batch)
BASE = {"batch_size": 64, "lr": 5e-3, "epochs": 1, "scale": 20.0}
RECIPES = [
    ("in-batch, 1 epoch", {}, False),
    ("in-batch, 3 epochs", {"epochs": 3}, False),
    ("in-batch, lr 1e-2", {"lr": 1e-2}, False),
    ("in-batch, lr 2e-3", {"lr": 2e-3}, False),
    ("in-batch, 2 epochs", {"epochs": 2}, False),
    ("in-batch, 5 epochs", {"epochs": 5}, False),
    ("in-batch, 3 epochs + contexts 0.5", {"epochs": 3, "context_weight": 0.5}, False),
    ("in-batch, scale 30", {"scale": 30.0}, False),
    ("in-batch, scale 50", {"scale": 50.0}, False),
    ("in-batch, batch 32", {"batch_size": 32}, False),
    ("in-batch, batch 128", {"batch_size": 128}, False),
    # tracer_plus's own settings beside the encoder's (--scorer tracer_plus only)
    ("in-batch, mlp", {"scorer": {"model": "mlp"}}, False),
    ("in-batch, 2 epochs, mlp", {"epochs": 2, "scorer": {"model": "mlp"}}, False),
    ("in-batch, vector top 20", {"scorer": {"vector_candidates": 20}}, False),
    ("in-batch, batch 32, 2 epochs", {"batch_size": 32, "epochs": 2}, False),
    ("in-batch + contexts 0.5", {"context_weight": 0.5}, False),
    ("in-batch + contexts 1", {"context_weight": 1.0}, False),
    ("in-batch + contexts 1, 2 epochs", {"context_weight": 1.0, "epochs": 2}, False),
    ("in-batch + contexts 1, 3 epochs", {"context_weight": 1.0, "epochs": 3}, False),
    ("registry, 1 epoch", {}, True),
    ("registry, 3 epochs", {"epochs": 3}, True),
    ("registry, 3 epochs, scale 30", {"epochs": 3, "scale": 30.0}, True),
    ("registry, 5 epochs", {"epochs": 5}, True),
    ("registry, 10 epochs", {"epochs": 10}, True),
    ("registry, 3 epochs, batch 32", {"epochs": 3, "batch_size": 32}, True),
    ("registry, 3 epochs, lr 2e-3", {"epochs": 3, "lr": 2e-3}, True),
    ("registry, 3 epochs, lr 1e-2", {"epochs": 3, "lr": 1e-2}, True),
]

# the tool text variants (the "try parameter names and descriptions"), measured here on the static encoder
TOOL_TEXTS = {
    "search": lambda t: t.search_text,
    "params": lambda t: f"{t.search_text} ({', '.join(t.parameters.get('properties') or {})})",
    "params_desc": lambda t: t.search_text + "".join(
        f" | {n}: {(p or {}).get('description', '')}" for n, p in (t.parameters.get("properties") or {}).items()),
}


def retext(pairs: Pairs, text: dict[str, str]) -> Pairs:
    return Pairs(pairs.anchors, tuple(text[p] for p in pairs.positives), pairs.trajectory_ids)


def split_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments naming the outer fold whose training trajectories are split: evaluate.py's folds."""
    ap.add_argument("--dataset", default="bfcl")
    ap.add_argument("--registry", default="large")
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)


def inner_split(a: argparse.Namespace):
    """The dataset, outer fold ``a.fold``'s training trajectories (evaluate.py's split; its test side is never
    read) and the validation groups set aside among them (:func:`validation_groups`)."""
    ds = build_dataset(a.dataset, a.registry, a.seed)
    train = kfold(ds.trajectories, a.folds, a.seed)[a.fold].train
    return ds, train, validation_groups(train, a.seed)


def validation_groups(train, seed: int) -> set[str]:
    """The inner validation split: 20 % of the training trajectories' groups, seeded (the rest is fitted on)."""
    groups = sorted({t.group for t in train})
    return set(random.Random(seed).sample(groups, max(1, len(groups) // 5)))


def ranking_metrics(sims: np.ndarray, golds, tools) -> dict:
    """recall@1/@5 and MRR of each row's gold tool (``golds``, texts among ``tools``) in ``sims``, ``[S, N]``."""
    col = {x: i for i, x in enumerate(tools)}
    gold = np.array([col[g] for g in golds])
    rank = (sims > sims[np.arange(len(gold)), gold][:, None]).sum(1) + 1    # [S] 1-based, ties to the gold
    return {"recall@1": round(float((rank <= 1).mean()), 4), "recall@5": round(float((rank <= 5).mean()), 4),
            "mrr": round(float((1 / rank).mean()), 4)}


def write_out(path: Path | None, doc: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")


def vector_metrics(table: torch.Tensor, model: StaticModel, anchors, golds, tools, max_tokens: int) -> dict:
    with torch.no_grad():
        q = encode(table, model, anchors, max_tokens)                       # [S, d]
        t = encode(table, model, tools, max_tokens)                         # [N, d]
    return ranking_metrics((q @ t.T).numpy(), golds, tools)                 # [S, N] cosines


def tracer_plus_metrics(registry, cfg: dict, fit, val, k: int, scorer_overrides: dict | None = None,
                        clean_inner: bool = True, vector: bool = False) -> dict:
    """tracer_plus (its config with ``scorer_overrides``) fitted on ``fit`` (trajectories) with a static encoder of
    recipe ``cfg`` trained on them, its inner folds clean (``clean_inner``) or sharing it, scored on the successful
    ``val`` trajectories' steps; ``vector``: plain vector search's figures too, under that key."""
    res = FoldEncoders(registry, cfg | {"inner_encoders": clean_inner})(fit)
    steps = [s for s in extract_all(t for t in val if t.success) if s.gold in registry]
    out = {}
    for name in ("tracer_plus", "vector") if vector else ("tracer_plus",):
        scorer = build_scorer(name, **((scorer_overrides or {}) if name == "tracer_plus" else {}))
        scorer.fit(fit, res)
        per_step = {m: round(sum(v) / len(v), 4) for m, v in teacher_forced_outcomes(scorer, steps, k).items()}
        out |= per_step if name == "tracer_plus" else {"vector": per_step}
    return out | {"steps": len(steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    split_arguments(ap)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tool-text", choices=tuple(TOOL_TEXTS), default="search",
                    help="the tool text trained and ranked (search: Tool.search_text, what the scorers embed)")
    ap.add_argument("--recipes", nargs="+", default=None, help="labels of RECIPES to run (default: all)")
    ap.add_argument("--scorer", choices=("vector", "tracer_plus"), default="vector",
                    help="what scores a recipe on the validation split: plain vector search, or tracer_plus")
    ap.add_argument("--config", default="static_mnrl", help="the static encoder_training config the recipes vary "
                    "(static_query: a query encoder beside its teacher; --scorer tracer_plus only)")
    ap.add_argument("--inner", choices=("clean", "shared"), default="clean",
                    help="tracer_plus's inner folds: each under an encoder trained without it, or sharing one")
    a = ap.parse_args()
    if a.config != "static_mnrl" and a.scorer != "tracer_plus":
        ap.error(f"--config {a.config}: only with --scorer tracer_plus (the vector rows train static_mnrl's table)")
    if a.scorer == "tracer_plus" and a.tool_text != "search":
        ap.error("--scorer tracer_plus ranks the registry's own tool text; --tool-text must stay search")
    torch.set_num_threads(1)
    ds, train, val_groups = inner_split(a)
    cfg = OmegaConf.to_container(load_config("encoder_training", a.config, seed=a.seed))
    enc = FoldEncoders(ds.registry, cfg)
    text = {t.search_text: TOOL_TEXTS[a.tool_text](t) for t in ds.registry}
    fit = retext(enc.pairs([t for t in train if t.group not in val_groups]), text)
    val = retext(enc.pairs([t for t in train if t.group in val_groups]), text)
    tools = [text[t.search_text] for t in ds.registry]
    if a.scorer == "tracer_plus":
        fit_t = [t for t in train if t.group not in val_groups]
        val_t = [t for t in train if t.group in val_groups]
        rows = []
        for label, over, registry_negatives in RECIPES:
            if a.recipes is not None and label not in a.recipes:
                continue
            t0 = time.perf_counter()
            over = dict(over)
            scorer_overrides = over.pop("scorer", None)
            recipe = cfg | BASE | over | {"negatives": "registry" if registry_negatives else "in_batch"}
            rows.append({"recipe": label, "seconds": 0.0,
                         **tracer_plus_metrics(ds.registry, recipe, fit_t, val_t, 5, scorer_overrides,
                                               a.inner == "clean", a.config != "static_mnrl")})
            rows[-1]["seconds"] = round(time.perf_counter() - t0, 1)
            print(json.dumps(rows[-1]), flush=True)
        write_out(a.out, {"dataset": a.dataset, "registry": a.registry, "outer_fold": a.fold, "seed": a.seed,
                          "scorer": "tracer_plus", "config": a.config, "inner": a.inner, "fit_pairs": len(fit),
                          "validation_groups": len(val_groups),
                          "rows": rows})
        return
    base = StaticModel.from_pretrained(str(distilled(enc.base_model, enc.pca_dims, enc.encoder_dir) / "model"))
    zero = torch.tensor(np.asarray(base.embedding, dtype=np.float32))
    rows = [{"recipe": "zero-shot distillation", "train_seconds": 0.0,
             **vector_metrics(zero, base, val.anchors, val.positives, tools, enc.recipe.max_seq_length)}]
    print(json.dumps(rows[-1]), flush=True)
    for label, over, registry_negatives in RECIPES:
        if (a.recipes is not None and label not in a.recipes) or (a.recipes is None and "scorer" in over):
            continue
        over = {**BASE, **over}
        context_weight = over.pop("context_weight", 0.0)
        recipe = replace(enc.recipe, **over)
        t0 = time.perf_counter()
        table, _ = train_static(fit, recipe, base, candidates=tools if registry_negatives else None,
                                context_weight=context_weight)
        rows.append({"recipe": label, "train_seconds": round(time.perf_counter() - t0, 1),
                     **vector_metrics(torch.from_numpy(table), base, val.anchors, val.positives, tools,
                                      recipe.max_seq_length)})
        print(json.dumps(rows[-1]), flush=True)
    write_out(a.out, {"dataset": a.dataset, "registry": a.registry, "outer_fold": a.fold, "seed": a.seed,
                      "tool_text": a.tool_text, "fit_pairs": len(fit), "validation_pairs": len(val),
                      "validation_groups": len(val_groups), "rows": rows})


if __name__ == "__main__":
    main()
