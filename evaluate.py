"""Evaluate a tool selector on a benchmark: python evaluate.py [dataset=bfcl] [scorer=...] [k=5] [regime=...]

Writes metrics.json, steps.jsonl, the resolved config and plots to the Hydra run directory
(``hydra.run.dir=DIR`` to choose it) and prints a summary table. See README for every option.
"""

from __future__ import annotations

import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@hydra.main(version_base="1.3", config_path="tracer/configs", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    from tracer.jobs.evaluate import run_job, summary_table
    from tracer.jobs.ranks import rank_run_dir
    from tracer.learn.distributed import is_writer

    # under torchrun every rank runs the folds; rank 0 keeps the outputs
    with rank_run_dir(HydraConfig.get().runtime.output_dir, cfg) as run_dir:
        doc = run_job(cfg, str(run_dir))
    if not is_writer():
        return None
    print(summary_table(doc))
    print(f"metrics: {os.path.join(run_dir, 'metrics.json')}")
    return doc["mean"]["recall_at_k"]


if __name__ == "__main__":
    main()
