"""A failed ``train.py``/``evaluate.py`` run leaves no run directory behind (a Hydra callback).

Hydra creates the run directory (and any missing parents) before the job starts, so a run that fails on
its first line still leaves ``outputs/.../<time>_<name>/`` holding only Hydra's own files. This callback
notes, before Hydra creates anything, the topmost folder of ``hydra.run.dir`` that does not exist yet;
when the job fails before writing any output of its own (the folder holds only Hydra's ``.hydra/`` and
its job log), it removes that folder: everything in it was created by this run. A run that failed after
writing outputs (an evaluation whose executor failed writes its metrics, then exits non-zero) keeps
them. A run directory that existed before the run is never touched. Wired in ``configs/train.yaml`` and
``configs/evaluate.yaml`` under ``hydra.callbacks``; single runs only (a multirun's sweep folder is the
launcher's).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback


def first_missing(path: Path) -> Path | None:
    """The topmost folder on the way to ``path`` that does not exist (``path`` itself if only it is
    missing)."""
    path = path.absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def holds_only_hydra_files(run_dir: Path) -> bool:
    """True if ``run_dir`` has nothing but Hydra's own ``.hydra/`` folder and ``*.log`` job logs."""
    return all(p.name == ".hydra" or (p.is_file() and p.suffix == ".log") for p in run_dir.iterdir())


class RemoveFailedRun(Callback):
    def __init__(self) -> None:
        self.created: Path | None = None

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        # resolved here, before Hydra's mkdir; ${now:...} is cached, so the job sees the same path
        self.created = first_missing(Path(str(config.hydra.run.dir)))

    def on_job_end(self, config: Any, job_return: JobReturn, **kwargs: Any) -> None:
        if job_return.status != JobStatus.FAILED or self.created is None or not self.created.is_dir():
            return
        run_dir = Path(str(config.hydra.runtime.output_dir))
        if not run_dir.is_dir() or holds_only_hydra_files(run_dir):
            shutil.rmtree(self.created, ignore_errors=True)
