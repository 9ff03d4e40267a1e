"""Fit the blend head on a whole dataset and report it: python train.py [dataset=bfcl] [logger=wandb]

Builds the deployable TRACER index with the learned head beside it (``<run dir>/index``, load it
with ``TracerScorer.load``), writes the head's weights and feature statistics, the loss curve, the
resolved config, and a report (``report.json``/``report.md``: predicted w and T per environment,
the w head's coefficients, fit time, and an outer-fold held-out comparison with a feature
ablation) to the Hydra run directory (``hydra.run.dir=DIR`` to choose it). The job is
:func:`tracer.train.job.run_job`.
"""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@hydra.main(version_base="1.3", config_path="tracer/configs", config_name="train")
def main(cfg: DictConfig) -> float:
    from tracer.train.job import run_job

    out = Path(HydraConfig.get().runtime.output_dir)
    report = run_job(cfg, out)
    print((out / "report.md").read_text())
    print(f"run directory: {out}")
    return report["fit"]["best_val_loss"]


if __name__ == "__main__":
    main()
