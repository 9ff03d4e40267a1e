"""Metric loggers: a small Protocol, a no-op logger and Weights & Biases (imported lazily).

W&B runs offline by default: it writes a run directory under the job's output directory that
``wandb sync`` can upload later; ``mode: online`` logs live.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol


class MetricLogger(Protocol):
    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None: ...

    def log_summary(self, summary: Mapping[str, Any]) -> None: ...

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None: ...

    def log_image(self, name: str, path: str | Path) -> None: ...

    def finish(self) -> None: ...


class NullLogger:
    def log_config(self, config):
        pass

    def log(self, metrics, step=None):
        pass

    def log_summary(self, summary):
        pass

    def log_table(self, name, columns, rows):
        pass

    def log_image(self, name, path):
        pass

    def finish(self):
        pass


class WandbLogger:
    """Weights & Biases logger.

    Args:
        project, entity, tags: the W&B run's place.
        mode: ``offline`` (default), ``online`` or ``disabled``.
        dir: where the ``wandb/`` run directory is written (the job's output directory).
        name: run name.
    """

    def __init__(self, project: str = "tracer", entity: str | None = None, mode: str = "offline",
                 dir: str | Path = ".", name: str | None = None, tags: Sequence[str] = (),
                 group: str | None = None, **_: Any):
        import wandb  # lazy: only a wandb run needs it

        self._wandb = wandb
        Path(dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, entity=entity, mode=mode, dir=str(dir), name=name,
                              tags=list(tags), group=group, reinit="finish_previous",
                              settings=wandb.Settings(console="off", x_disable_stats=True))

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir).parent

    def log_config(self, config):
        self.run.config.update(dict(config), allow_val_change=True)

    def log(self, metrics, step=None):
        self.run.log(dict(metrics), step=step)

    def log_summary(self, summary):
        for k, v in summary.items():
            self.run.summary[k] = v

    def log_table(self, name, columns, rows):
        self.run.log({name: self._wandb.Table(columns=list(columns), data=[list(r) for r in rows])})

    def log_image(self, name, path):
        self.run.log({name: self._wandb.Image(str(path))})

    def finish(self):
        self.run.finish()

