"""Where a job's rank writes under torchrun: rank 0 into Hydra's run directory, every other rank into a
temporary one it removes, with no logger run of its own (one W&B run per job, rank 0's)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, open_dict

from tracer.learn.distributed import init_from_env, is_writer


@contextmanager
def rank_run_dir(output_dir: str | Path, cfg: DictConfig) -> Iterator[Path]:
    """Join torchrun's process group (if any) and yield this rank's run directory; outside torchrun, the
    single process is rank 0 and writes into ``output_dir``."""
    init_from_env()
    if is_writer():
        yield Path(output_dir)
        return
    with open_dict(cfg):
        cfg.logger = None
    scratch = Path(tempfile.mkdtemp(prefix="tracer-rank-"))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
