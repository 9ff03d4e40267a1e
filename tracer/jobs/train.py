"""The training job of ``train.py``: fit a scorer (and the encoder its recipe trains) on every trajectory of a
dataset, save one self-contained index, and report what it cost and how well it does on held-out folds.

Example::

    cfg = compose("train", overrides=["experiment=preset/best", "dataset=bfcl"])   # configs/train.yaml
    report = run_job(cfg, Path("outputs/train/run"))                # -> run/index, run/report.md

The held-out metrics are ``evaluate.py``'s on the same config (:func:`tracer.jobs.evaluate.run_job`, written
to ``<run dir>/heldout/``): each outer fold trains its own encoder and scorer on its training trajectories
only, so they measure the recipe that built the index, not the index on data it saw.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from tracer.build import build_dataset, build_embedder, build_fold_encoders, build_logger, build_scorer, plain
from tracer.core.folds import check_folds
from tracer.core.io import atomic_write_text, write_json
from tracer.core.store import read_json
from tracer.core.validate import TRAIN_INTS, check_config
from tracer.jobs.evaluate import run_job as evaluate
from tracer.jobs.train_summary import index_size, report_markdown
from tracer.learn.blend_report import blend_head_report
from tracer.retriever import Retriever
from tracer.scorer_base.resources import Resources
from tracer.scorers.tracer import TracerScorer

# train.py's own keys; the rest of its config is an evaluate.py config (the held-out run's)
TRAIN_ONLY = ("save_index", "preset")


def run_job(cfg: DictConfig, out: Path) -> dict[str, Any]:
    """Run the job described by ``cfg`` (the composed ``configs/train.yaml``) into ``out``; returns the
    report.

    Writes ``config.yaml``, ``index/`` (unless ``save_index=false``), ``heldout/`` (evaluate.py's outputs on
    the outer folds, unless ``folds=0``), ``report.json`` and ``report.md``; with ``scorer=tracer`` also the
    blend head's files (:func:`tracer.learn.blend_report.blend_head_report`).
    """
    c = plain(cfg)
    check_config(c, TRAIN_INTS)  # before any work: a bad override is named, nothing is written
    torch.manual_seed(c["seed"])
    ds = build_dataset(c["dataset"], c.get("registry"), c["seed"])
    if c["folds"]:  # the held-out run comes after the fit: a folds override it cannot meet fails now
        check_folds(c["folds"], ds.trajectories)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    logger = build_logger(
        c.get("logger"), out, run_name=f"train_{ds.name}_{c.get('preset') or c['scorer']['name']}"
    )
    logger.log_config(c)

    t0 = time.perf_counter()
    encoders = None
    if c.get("encoder_training"):
        encoders = build_fold_encoders(
            ds.registry,
            c["encoder_training"],
            c["embedder"].get("cache_dir"),
            device=c.get("device"),
            seed=c["seed"],
        )
        res = encoders(ds.trajectories)
    else:
        res = Resources.build(
            ds.registry, build_embedder(c["embedder"]), device=c.get("device"), seed=c["seed"]
        )
    t1 = time.perf_counter()
    scorer = build_scorer(c["scorer"])
    fit = scorer.fit(ds.trajectories, res)
    t2 = time.perf_counter()
    index = None
    if c.get("save_index", True):
        index = Retriever(scorer, c["k"]).save(out / "index")
    t3 = time.perf_counter()

    report: dict[str, Any] = {
        "dataset": ds.name,
        "registry_size": len(ds.registry),
        "trajectories": len(ds.trajectories),
        "steps": fit.n_steps,
        "preset": c.get("preset"),
        "scorer": c["scorer"]["name"],
        "encoder": res.embedder.name,
        "slow_encoder": res.slow.embedder.name if res.slow is not None else None,
        "seconds": {
            "encoder": t1 - t0,
            "scorer": t2 - t1,
            "save": t3 - t2,
            "scorer_stages": {
                k: v for k, v in fit.history.items() if "seconds" in k and isinstance(v, (int, float))
            },
        },
        "encoder_training": [_summary(h) for h in (encoders.history if encoders else [])],
        "index": index_size(index) | {"path": str(index)} if index is not None else None,
        "heldout": None,
    }
    if isinstance(scorer, TracerScorer) and scorer.head is not None and fit.data is not None:
        # scorer=tracer: the paper's blend head (tracer_fixed has none)
        report["blend_head"] = blend_head_report(c, ds, res, scorer, fit, out, logger)
    if c["folds"]:
        heldout_cfg = {k: v for k, v in c.items() if k not in TRAIN_ONLY} | {"logger": None}
        doc = evaluate(heldout_cfg, out / "heldout")
        curve = read_json(out / "heldout" / "run_info.json")[
            "recall_curve"
        ]  # pooled over steps, k = 1, 2, ...
        report["heldout"] = {
            "folds": doc["folds"],
            "k": doc["k"],
            "n_steps": doc["n_steps"],
            "registry_size": doc["registry_size"],
            "recall_at_1": curve[0],
            "recall_at_5": curve[4] if len(curve) > 4 else None,
            "mean": doc["mean"],
            "sd": doc["sd"],
            "metrics": str(out / "heldout" / "metrics.json"),
        }
        logger.log_summary({f"heldout/{k}": v for k, v in doc["mean"].items() if v is not None})
    write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", report_markdown(report))
    logger.log_summary(
        {f"seconds/{k}": v for k, v in report["seconds"].items() if isinstance(v, float)}
        | ({"index/bytes": report["index"]["bytes"]} if index is not None else {})
    )
    logger.finish()
    return report


def _summary(history: dict[str, Any]) -> dict[str, Any]:
    """An encoder's history without its per-step curve and trajectory ids (a cascade's slow stage
    likewise)."""
    out = {k: v for k, v in history.items() if k not in ("trajectory_ids", "loss")}
    if isinstance(out.get("slow"), dict):
        out["slow"] = _summary(out["slow"])
    return out
