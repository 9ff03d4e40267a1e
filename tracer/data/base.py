"""The dataset record every loader returns, and the loader registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tracer.core.steps import extract_all
from tracer.core.types import Registry, Step, Trajectory


@dataclass(frozen=True)
class Dataset:
    """A registry plus trajectories. ``skipped`` counts what a loader left out, by reason (never silent)."""

    name: str
    registry: Registry
    trajectories: tuple[Trajectory, ...]
    skipped: Mapping[str, int] = field(default_factory=dict)
    # the class that runs this dataset's tasks in free-running (``tracer.envs.base.Environment``), as a dotted
    # path: data sits below environments, so it names one without importing it; None: teacher forcing only
    environment: str | None = None

    @property
    def executable(self) -> bool:
        return self.environment is not None

    def steps(self) -> list[Step]:
        return extract_all(self.trajectories)

    def domains(self) -> list[str]:
        return sorted({t.domain for t in self.trajectories})


LOADERS: dict[str, Callable[..., Dataset]] = {}


def register_loader(name: str):
    def deco(fn: Callable[..., Dataset]):
        LOADERS[name] = fn
        return fn
    return deco


def load_dataset(loader: str, /, **kwargs) -> Dataset:
    """Load a dataset by loader name (``bfcl``, ``tau2``, ``apibank``, ``jsonl``) with the loader's
    options."""
    if loader not in LOADERS:
        raise KeyError(f"unknown dataset {loader!r}; valid names: {', '.join(sorted(LOADERS))}")
    return LOADERS[loader](**kwargs)
