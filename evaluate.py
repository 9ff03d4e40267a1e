"""Evaluate a tool selector on a benchmark: python evaluate.py [dataset=bfcl] [scorer=...] [k=5] [regime=...]

Writes metrics.json, steps.jsonl, the resolved config and plots to the Hydra run directory
(``hydra.run.dir=DIR`` to choose it) and prints a summary table. See README for every option.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@hydra.main(version_base="1.3", config_path="tracer/configs", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    from tracer.jobs.evaluate import run_job, summary_table
    from tracer.learn.distributed import init_from_env, is_writer

    init_from_env()  # under torchrun: one process group; every rank runs the folds, rank 0 keeps the outputs
    run_dir = HydraConfig.get().runtime.output_dir if is_writer() else tempfile.mkdtemp(prefix="tracer-rank-")
    if not is_writer():  # one logger run (W&B): rank 0's
        with open_dict(cfg):
            cfg.logger = None
    doc = run_job(cfg, run_dir)
    if not is_writer():
        shutil.rmtree(run_dir, ignore_errors=True)
        return None
    print(summary_table(doc))
    print(f"metrics: {os.path.join(run_dir, 'metrics.json')}")
    return doc["mean"]["recall_at_k"]


if __name__ == "__main__":
    main()
