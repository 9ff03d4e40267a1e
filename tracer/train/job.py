"""The training job of ``train.py``: fit TRACER with the learned blend head on a whole dataset, save
the head and the deployable index, and report it (outer-fold ablation, w and T, coefficients, plots).

Example::

    cfg = compose("train", overrides=["dataset=bfcl"])      # configs/train.yaml
    report = run_job(cfg, Path("outputs/train/run"))
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from tracer.build import build_dataset, build_embedder, build_logger, build_scorer, plain
from tracer.core.folds import check_folds
from tracer.core.io import atomic_save, atomic_write_text, write_json
from tracer.core.validate import TRAIN_INTS, check_config
from tracer.scoring.resources import Resources
from tracer.train.blend_report import build_report, heldout_ablation, plot_wt, report_markdown, wt_summary


def run_job(cfg: DictConfig, out: Path) -> dict[str, Any]:
    """Run the job described by ``cfg`` (the composed ``configs/train.yaml``) into ``out``; returns the report.

    Writes ``config.yaml``, ``blend_head.pt``, ``feature_stats.json``, ``history.json``,
    ``report.json``/``report.md``, ``wt_hist.png`` and (``save_index``) ``index/``.
    """
    check_config(plain(cfg), TRAIN_INTS)  # before any work: a bad override is named, nothing is written
    if cfg.scorer.get("blend") != "learned":
        raise ValueError(f"train.py fits the blend head: scorer {cfg.scorer.get('name')!r} has no learned blend "
                         "(blend: learned, as scorer=tracer has)")
    torch.manual_seed(cfg.seed)
    ds = build_dataset(cfg.dataset, None, cfg.seed)
    if cfg.folds:  # the held-out comparison runs after the fit: a folds override it cannot meet fails now
        check_folds(cfg.folds, ds.trajectories)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    logger = build_logger(plain(cfg.get("logger")), out, run_name=f"train_{cfg.dataset.name}")
    logger.log_config(plain(cfg))

    res = Resources.build(ds.registry, build_embedder(cfg.embedder), device=cfg.device, seed=cfg.seed)
    scorer = build_scorer(cfg.scorer)
    t0 = time.perf_counter()
    fit = scorer.fit(ds.trajectories, res)  # builds the full trie and fits the head by inner folds
    hist = {**fit.history, "seconds_total_fit": time.perf_counter() - t0}
    head = scorer.head

    atomic_save(head.state_dict(), out / "blend_head.pt")
    write_json(out / "feature_stats.json", head.feature_stats())
    write_json(out / "history.json", hist)
    if cfg.save_index:
        scorer.save(out / "index")
    _log_curves(logger, hist)

    m = plain(cfg.scorer)
    data = fit.data  # the out-of-fold steps the head was fitted on
    ablation = heldout_ablation(ds.trajectories, res, scorer.key, scorer.rendering, m["eps"], m["successful_only"],
                                m["head"], cfg.folds, cfg.seed) if cfg.folds else None
    report = build_report(ds.name, head, hist, data, ablation)
    write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", report_markdown(report))

    wt = wt_summary(head, data)
    logger.log_image("w_T_hist", plot_wt(wt["w"], wt["T"], out / "wt_hist.png"))
    logger.log_table("w_T", ["domain", "w", "T"], list(zip(wt["domains"], wt["w"], wt["T"])))
    logger.log_table("w_coefficients", ["feature", "coefficient"], list(report["coefficients"]["w"].items()))
    logger.log_summary({f"w_T/{k}": v for k, v in report["wt"]["all"].items()} | {
        "fit/seconds": hist["seconds_fit"], "fit/best_val_loss": hist["best_val_loss"]})
    logger.finish()
    return report


def _log_curves(logger, hist: Mapping[str, Any]) -> None:
    """One loss curve per early-stopping fold."""
    for run in hist["runs"]:
        v = run["val_fold"]
        for tl, vl, va in zip(run["train_loss"], run["val_loss"], run["val_acc"]):
            logger.log({f"fold{v}/train_loss": tl, f"fold{v}/val_loss": vl, f"fold{v}/val_recall_at_1": va})
