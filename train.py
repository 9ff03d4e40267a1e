"""Fit the blend head on a whole dataset and report it: python train.py [dataset=bfcl] [logger=wandb]

Builds the deployable TRACER index with the learned head beside it (``<run dir>/index``, load it
with ``TracerScorer.load``), writes the head's weights and feature statistics, the loss curve, the
resolved config, and a report (``report.json``/``report.md``: predicted w and T per environment,
the w head's coefficients, fit time, and an outer-fold held-out comparison with a feature
ablation) to the Hydra run directory (``hydra.run.dir=DIR`` to choose it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run(cfg: DictConfig, out: Path) -> dict:
    import torch

    from tracer.build import build_dataset, build_embedder, build_scorer_cfg, plain
    from tracer.core.io import atomic_save, atomic_write_text, write_json
    from tracer.core.loggers import build_logger
    from tracer.core.validate import TRAIN_INTS, check_config
    from tracer.learn import blend
    from tracer.scoring.resources import Resources

    check_config(plain(cfg), TRAIN_INTS)  # before any work: a bad override is named, nothing is written
    torch.manual_seed(cfg.seed)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    logger = build_logger(plain(cfg.get("logger")), out, run_name=f"train_{cfg.dataset.name}")
    logger.log_config(plain(cfg))

    ds = build_dataset(cfg.dataset, None, cfg.seed)
    res = Resources.build(ds.registry, build_embedder(cfg.embedder), device=cfg.device, seed=cfg.seed)
    scorer = build_scorer_cfg(cfg.model)
    t0 = time.perf_counter()
    scorer.fit(ds.trajectories, res)  # builds the full trie and fits the head by inner folds
    hist = {**scorer.head_history, "seconds_total_fit": time.perf_counter() - t0}
    head = scorer.head

    atomic_save(head.state_dict(), out / "blend_head.pt")
    write_json(out / "feature_stats.json", head.feature_stats())
    write_json(out / "history.json", hist)
    if cfg.save_index:
        scorer.save(out / "index")
    for run in hist["runs"]:  # one loss curve per early-stopping fold
        v = run["val_fold"]
        for i, (tl, vl, va) in enumerate(zip(run["train_loss"], run["val_loss"], run["val_acc"])):
            logger.log({f"fold{v}/train_loss": tl, f"fold{v}/val_loss": vl, f"fold{v}/val_recall_at_1": va})

    m = plain(cfg.model)
    args = {"key": scorer.key, "rendering": scorer.rendering, "eps": m["eps"], "successful_only": m["successful_only"]}
    data = scorer.head_data  # the out-of-fold steps the head was fitted on
    ablation = blend.heldout_ablation(ds.trajectories, res, head=m["head"], folds=cfg.folds, seed=cfg.seed,
                                      **args) if cfg.folds else None
    report = blend.build_report(ds.name, head, hist, data, ablation)
    write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", blend.report_markdown(report))

    wt = blend.wt_summary(head, data)
    logger.log_image("w_T_hist", blend.plot_wt(wt["w"], wt["T"], out / "wt_hist.png"))
    logger.log_table("w_T", ["domain", "w", "T"], list(zip(wt["domains"], wt["w"], wt["T"])))
    logger.log_table("w_coefficients", ["feature", "coefficient"], list(report["coefficients"]["w"].items()))
    logger.log_summary({f"w_T/{k}": v for k, v in report["wt"]["all"].items()} | {
        "fit/seconds": hist["seconds_fit"], "fit/best_val_loss": hist["best_val_loss"]})
    logger.finish()
    return report


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float:
    out = Path(HydraConfig.get().runtime.output_dir)
    report = run(cfg, out)
    print((out / "report.md").read_text())
    print(f"run directory: {out}")
    return report["fit"]["best_val_loss"]


if __name__ == "__main__":
    main()
