"""Train a retriever into a deployable index: python train.py [experiment=preset/NAME] [dataset=...] [folds=0]

Fits the scorer (and trains the encoder its recipe names) on every trajectory of the dataset and writes one
self-contained index to ``<run dir>/index`` (it carries its encoders: serve it with ``tracer serve --index``,
``tracer mcp --index`` or ``Retriever.load`` from anywhere), the resolved config, evaluate.py's held-out
metrics on outer folds of the same data (``heldout/``) and a report (``report.json``/``report.md``: seconds
per stage, the index's size by part, the held-out metrics). ``hydra.run.dir=DIR`` chooses the run directory.
The job is :func:`tracer.jobs.train.run_job`.
"""

from __future__ import annotations

import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@hydra.main(version_base="1.3", config_path="tracer/configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from tracer.jobs.ranks import rank_run_dir
    from tracer.jobs.train import run_job
    from tracer.learn.distributed import is_writer

    hc = HydraConfig.get()
    with open_dict(cfg):
        cfg.preset = hc.runtime.choices.get("experiment")
    # under torchrun every rank runs the job; rank 0 keeps the outputs
    with rank_run_dir(hc.runtime.output_dir, cfg) as out:
        report = run_job(cfg, out)
    if not is_writer():
        return None
    print((out / "report.md").read_text())
    print(f"run directory: {out}")
    return report["heldout"]["mean"]["recall_at_k"] if report["heldout"] else None


if __name__ == "__main__":
    main()
