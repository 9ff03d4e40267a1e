"""Learning curves: recall as logged trajectories accumulate, and the cold start at zero.

    nice -n 10 python -m experiments.studies.learning_curves.learning_curves        # bfcl, tau2, apibank
    nice -n 10 python -m experiments.studies.learning_curves.learning_curves --datasets bfcl \
        --out results/learning_curves

Inside each outer fold (the evaluation's folds: by group, seeded, ``--folds``), the training
trajectories are put in a seeded arrival order and every scorer is fitted on the first N of them
(N in ``--ns``; ``all`` = the whole training split); all are evaluated on the same held-out steps
(teacher forcing: successful held-out trajectories, gold in the registry), recall@1 and recall@k.
Scorers: their configs in ``configs/scorer/`` (registry ``large``, MiniLM behind the shared
embedding cache); ``tracer_plus_transfer`` is ``tracer_plus`` with the candidate model trained on
the *other* datasets (:mod:`tracer.online.transfer`) instead of on the N trajectories: the cold start.
``cold_start`` is ``experiment=preset/cold_start`` as evaluate.py composes it for the dataset (its scorer over
its own embedder: the general encoder trained without the dataset, built on first use), ``vector_general``
vector search over that encoder (:data:`COMPOSED`).
A fit that cannot run at some N (e.g. the blend head without data) is recorded with its error.

Writes ``<out>/<dataset>.csv`` (``<dataset>.<tag>.csv`` with ``--tag``; one row per fold, N, scorer),
``<out>/summary.md`` (mean ± SD over folds) and ``<out>/<dataset>.png`` (recall@1 and @k against N, SD bars).
A rerun resumes: it skips the (fold, N, scorer) rows its file holds. After a default changes, ``--force``
removes the rows this run would write (its scorers at its Ns, in its folds) and runs them again.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from functools import cache
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from tracer.build import CONFIG_DIR, build_dataset, build_embedder, build_scorer, load_config
from tracer.core.folds import arrival_order, kfold
from tracer.online.transfer import fit_transfer_model
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources, training_steps
from tracer.scorers.tracer_plus.model import save_candidate_model

ROOT = Path(__file__).resolve().parents[3]  # experiments/studies/<topic>/ -> the repository
SCORERS = ("vector", "tool2vec", "toolnet", "autotool", "tracer", "tracer_plus", "tracer_plus_transfer")
FIELDS = ("dataset", "fold", "n", "n_train", "scorer", "recall_at_1", "recall_at_k", "n_test", "fit_s",
          "error")


# tracer_plus with the last two of the five slots for never-called tools of its zero-shot top 3, with the
# fusion among its candidates, and without usage vectors in the fusion (the default before them)
VARIANTS = {"tracer_plus_novel3x2": {"zero_shot": {"novel": 3, "slots": 2}},
            "tracer_plus_zscand": {"zero_shot": {"candidates": True}},
            "tracer_plus_nousage": {"zero_shot": {"usage": None}}}
# scorers over an embedder of their own, composed as evaluate.py composes these overrides
COMPOSED = {"cold_start": ["experiment=preset/cold_start"],
            "vector_general": ["scorer=vector", "embedder=general"],
            "cold_start_zsusage": ["experiment=preset/cold_start", "scorer.zero_shot.usage=1.0"]}


@cache
def composed(name: str, dataset: str):
    """:data:`COMPOSED` ``name``'s config for ``dataset``, as ``evaluate.py ... dataset=...`` composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("evaluate", overrides=[*COMPOSED[name], f"dataset={dataset}"])


def make_scorer(name: str, transfer: Path | None = None, dataset: str = ""):
    """A scorer from its YAML; ``tracer_plus_transfer`` is tracer_plus's with ``transfer`` set, a
    :data:`VARIANTS` name tracer_plus's with those overrides, a :data:`COMPOSED` name its config's."""
    if name in COMPOSED:
        return build_scorer(composed(name, dataset).scorer, name=name)
    if name in VARIANTS:
        return build_scorer("tracer_plus", name=name, **VARIANTS[name])
    base = "tracer_plus" if name == "tracer_plus_transfer" else name
    if name == "tracer_plus_transfer":
        return build_scorer(base, name=name, transfer=str(transfer))
    return build_scorer(base)


def load(name: str, seed: int) -> tuple:
    # teacher forcing needs no BFCL backend
    ds = build_dataset(load_config("dataset", name, **({"execute": False} if name == "bfcl" else {})),
                       "large", seed)
    emb = build_embedder("minilm", cache_dir=str(ROOT / ".cache" / "embeddings"))
    return ds, Resources.build(ds.registry, emb, device="cpu", seed=seed)


_COMPOSED_RESOURCES: dict[tuple[str, str], Resources] = {}


def resources(name: str, scorer: str, loaded: dict, seed: int) -> Resources:
    """The resources ``scorer`` runs on: the dataset's (MiniLM), or over a :data:`COMPOSED` config's own
    embedder (built once)."""
    ds, res = loaded[name]
    if scorer not in COMPOSED:
        return res
    if (name, scorer) not in _COMPOSED_RESOURCES:
        emb = build_embedder(composed(scorer, name).embedder)
        _COMPOSED_RESOURCES[name, scorer] = Resources.build(ds.registry, emb, device="cpu", seed=seed)
    return _COMPOSED_RESOURCES[name, scorer]


def recalls(scorer, steps, res, k: int) -> tuple[float, float]:
    sel = finalize(scorer.score(steps), k, getattr(scorer, "pad", True))
    gold = torch.tensor([res.registry.id(s.gold) for s in steps])
    r1 = (sel.ranking[:, 0] == gold).float().mean().item()
    rk = float(np.mean([int(g) in p for g, p in zip(gold.tolist(), sel.presented)]))
    return r1, rk


def transfer_model(target: str, loaded: dict, out: Path, seed: int) -> Path:
    """The candidate model trained on every trajectory of the other datasets (cached in ``out``)."""
    path = out / f"transfer_to_{target}.pt"
    if not path.exists():
        scorer = make_scorer("tracer_plus")
        sources = [(ds.trajectories, res) for name, (ds, res) in loaded.items() if name != target]
        model, _ = fit_transfer_model(scorer, sources, seed)
        save_candidate_model(model, scorer.feature_names, path)
    return path


def redone(row: dict, args) -> bool:
    """Whether ``--force`` runs this CSV row again: its scorer, N and fold are among this run's."""
    return (row["scorer"] in args.scorers and row["n"] in args.ns
            and (not args.only_folds or int(row["fold"]) in args.only_folds))


def resumed(path: Path, args) -> set[tuple[str, str, str]]:
    """The (fold, N, scorer) rows of ``path`` this run skips: every row an earlier run wrote, less those
    ``--force`` runs again (removed from the file first; every other row stays)."""
    rows = []
    if path.exists():
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    if args.force and rows:
        rows = [r for r in rows if not redone(r, args)]
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            w.writerows(rows)
    return {(r["fold"], r["n"], r["scorer"]) for r in rows}


def run_dataset(name: str, loaded: dict, args, out: Path) -> None:
    ds, res = loaded[name]
    path = out / (f"{name}.{args.tag}.csv" if args.tag else f"{name}.csv")
    done = resumed(path, args)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        if not done and f.tell() == 0:
            w.writeheader()
        run_folds(name, ds, res, args, w, f, done, loaded, out)


def run_folds(name, ds, res, args, w, f, done, loaded, out) -> None:
    transfer = (transfer_model(name, loaded, out, args.seed) if "tracer_plus_transfer" in args.scorers
                else None)
    for split in kfold(ds.trajectories, args.folds, args.seed):
        if args.only_folds and split.fold not in args.only_folds:
            continue
        order = arrival_order(split.train, args.seed, split.fold)
        steps = training_steps(split.test, ds.registry, True)
        for n in args.ns:
            n_train = len(order) if n == "all" else min(int(n), len(order))
            for sc in args.scorers:
                if (str(split.fold), str(n), sc) in done:
                    continue
                row = {"dataset": name, "fold": split.fold, "n": n, "n_train": n_train, "scorer": sc,
                       "n_test": len(steps), "error": ""}
                t0 = time.perf_counter()
                try:
                    scorer, on = make_scorer(sc, transfer, name), resources(name, sc, loaded, args.seed)
                    scorer.fit(order[:n_train], on)
                    row["fit_s"] = round(time.perf_counter() - t0, 3)
                    row["recall_at_1"], row["recall_at_k"] = recalls(scorer, steps, on, args.k)
                except Exception as e:  # noqa: BLE001  (recorded: e.g. a blend head with no data to fit)
                    row["error"] = f"{type(e).__name__}: {e}"[:200]
                w.writerow(row)
                f.flush()
                print(name, split.fold, n, sc, row.get("recall_at_1"), row.get("recall_at_k"), row["error"],
                      flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=["bfcl", "tau2", "apibank"])
    p.add_argument("--scorers", nargs="+", default=list(SCORERS))
    p.add_argument("--ns", nargs="+", default=["0", "5", "10", "25", "50", "100", "200", "all"])
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--only-folds", type=int, nargs="*", default=None, help="run these outer folds only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "learning_curves")
    p.add_argument("--tag", default="",
                   help="write <dataset>.<tag>.csv (runs in parallel; the plot merges them)")
    p.add_argument("--force", action="store_true",
                   help="run again the rows of this run's scorers, Ns and folds that the file holds")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    need = set(args.datasets) | ({"bfcl", "tau2", "apibank"} if "tracer_plus_transfer" in args.scorers
                                 else set())
    loaded = {name: load(name, args.seed) for name in sorted(need)}
    for name in args.datasets:
        run_dataset(name, loaded, args, args.out)


if __name__ == "__main__":
    main()
