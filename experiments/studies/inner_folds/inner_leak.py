"""Does tracer_plus's inner-fold leak through a fine-tuned encoder matter? One outer fold, measured both ways.

    nice python -m experiments.studies.inner_folds.inner_leak [--dataset bfcl] [--fold 0] [--config mnrl] \
        [--out results/encoders/inner_leak.json]

With per-fold fine-tuning (``encoder_training=mnrl``) the outer fold's encoder saw every training
trajectory, including each inner fold that tracer_plus's candidate model is fitted on out of fold: its
vector features are better there than on unseen steps, which may over-weight them. This fits tracer_plus
on the outer fold's training split twice with the same outer encoder at test time:

- ``shared``: the inner folds are scored under the outer encoder (the default, ``inner_encoders: false``);
- ``clean``: each inner fold under an encoder fine-tuned without it (``inner_encoders: true``; one more
  training per inner fold, cached like the others),

and evaluates both on the outer fold's held-out steps (teacher forcing, k = 5): recall@1/@5, MRR and
paired tests (sign-flip, bootstrap 95% CI) of the difference. Also prints the weights the two
candidate models put on the vector features.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tracer.build import build_dataset, build_fold_encoders, build_scorer, load_config, plain
from tracer.core.folds import assign_folds
from tracer.core.steps import extract_all
from tracer.eval.metrics import paired_test, teacher_forced_outcomes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="bfcl")
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default="mnrl",
                    help="a transformer recipe in tracer/configs/encoder_training/ "
                                                     "(mnrl_l3_int8: the 3-layer student, served in int8)")
    ap.add_argument("--out", default="results/encoders/inner_leak.json")
    a = ap.parse_args()
    ds = build_dataset(a.dataset, "large", a.seed)
    fold_of = assign_folds([t.group for t in ds.trajectories], 5, a.seed)
    train = [t for t in ds.trajectories if fold_of[t.group] != a.fold]
    test = [s for s in extract_all(t for t in ds.trajectories if fold_of[t.group] == a.fold and t.success)
            if s.gold in ds.registry]
    cfg = plain(load_config("encoder_training", a.config, seed=a.seed)) | {"inner_encoders": True}
    encoders = build_fold_encoders(ds.registry, cfg, seed=a.seed)
    res = encoders(train)
    clean_fit = res.without
    out, runs = {}, {}
    for name, without in (("shared", None), ("clean", clean_fit)):
        res.without = without
        t0 = time.perf_counter()
        scorer = build_scorer("tracer_plus")
        scorer.fit(train, res)
        runs[name] = teacher_forced_outcomes(scorer, test, a.k)
        layer = next(p for p in scorer.model.parameters() if p.dim() == 2)               # [1 or H, F]
        out[name] = {m: sum(v) / len(v) for m, v in runs[name].items()} | {
            "fit_seconds": round(time.perf_counter() - t0, 1),
            "weights": dict(zip(scorer.feature_names, layer[0].tolist())) if layer.shape[0] == 1 else None}
        print(name, {m: round(v, 4) for m, v in out[name].items() if m != "weights"}, flush=True)
    out["clean_minus_shared"] = {m: paired_test(runs["clean"][m], runs["shared"][m]) for m in runs["clean"]}
    keys = ("checkpoint", "pairs", "train_seconds", "teacher", "teacher_train_seconds")
    out["outer_encoder"] = {k: encoders.outer[0][k] for k in keys}
    out["inner_encoders"] = [{k: h[k] for k in (*keys, "held_groups")}
                             for h in encoders.history if h["inner_of"] is not None]
    out |= {"dataset": a.dataset, "fold": a.fold, "steps": len(test), "k": a.k, "config": a.config}
    print(json.dumps(out["clean_minus_shared"], indent=1))
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
