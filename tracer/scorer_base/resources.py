"""What scorers are fitted with (:class:`Resources`) and the steps they learn from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tracer.core.applied import Applied
from tracer.core.context import ContextRendering
from tracer.core.steps import extract_all
from tracer.core.types import Registry, Step, Trajectory
from tracer.encode.embedders import Embedder, default_device
from tracer.encode.index import ToolIndex


@dataclass
class Resources:
    """What scorers are fitted with: the registry, the embedder, the shared FAISS tool index.

    ``executor`` is the model interface (for scorers that need summaries from a model, e.g.
    H-EPM and Insight); ``None`` means the offline deterministic path. ``without(groups)``, set when the
    encoder was trained on the training trajectories with clean inner folds (``FoldEncoders``: an
    :class:`tracer.learn.encoders.fold.InnerEncoders`), gives resources whose encoder never saw those groups:
    what a scorer's inner folds need to stay clean; ``None``: a fixed encoder.
    ``removed``: names of registered tools masked out of every ranking and selection of a retriever (drift,
    :meth:`tracer.online.updater.Updater.remove_tool`); scorers ignore it, a saved index keeps it.
    ``slow``: the same registry under a second, slower and better encoder, for a cascade's second stage
    (:class:`tracer.scorers.cascade.CascadeScorer`; ``FoldEncoders`` with a ``slow`` recipe); ``None``: one
    encoder. ``applied``: the ids of the logged trajectories updates have added (:mod:`tracer.core.applied`),
    so a log applied again is not counted twice; scorers ignore it, a saved index keeps it.
    """

    registry: Registry
    embedder: Embedder
    tool_index: ToolIndex
    device: str = "cpu"
    seed: int = 0
    executor: Any = None
    without: Callable[[frozenset[str]], Resources] | None = None
    removed: frozenset[str] = frozenset()
    slow: Resources | None = None
    applied: Applied = field(default_factory=Applied)

    @classmethod
    def build(cls, registry: Registry, embedder: Embedder, factory: str = "auto", device: str | None = None,
              seed: int = 0, executor: Any = None) -> Resources:
        return cls(registry, embedder, ToolIndex.build(registry, embedder, factory),
                   device or default_device(), seed, executor)

    @property
    def removed_ids(self) -> frozenset[int]:
        """Registry ids of the ``removed`` tools: never ranked or presented."""
        return frozenset(self.registry.id(n) for n in self.removed)

    def embed(self, steps: Sequence[Step], rendering: ContextRendering) -> torch.Tensor:
        """Context embeddings of steps under a rendering, ``[B, d]`` on ``self.device``."""
        return self.embedder.encode([rendering.render(s.context) for s in steps]).to(self.device)

    def tool_ids(self, names: Sequence[str]) -> torch.Tensor:
        ids = np.fromiter(map(self.registry.id, names), dtype=np.int64, count=len(names))  # [S]
        return torch.from_numpy(ids)  # torch.tensor of a list costs ~3x more on a small one


def training_steps(trajectories: Sequence[Trajectory], registry: Registry,
                   successful_only: bool = True) -> list[Step]:
    """Steps of the training trajectories a scorer learns from (successful ones by default)."""
    trajs = [t for t in trajectories if t.success or not successful_only]
    return [s for s in extract_all(trajs) if s.gold in registry]


def fit_steps(trajectories: Sequence[Trajectory], registry: Registry,
              successful_only: bool = True) -> list[Step]:
    """:func:`training_steps` for a fit: none is an error (a scorer fitted on nothing answers nothing)."""
    steps = training_steps(trajectories, registry, successful_only)
    if not steps:
        n_ok = sum(t.success for t in trajectories)
        raise ValueError(f"no training steps: {len(trajectories)} trajectories ({n_ok} successful"
                         f"{', only successful ones are used' if successful_only else ''}) hold no "
                         f"tool call of the registry; nothing to fit")
    return steps


def fallback_scores(res: Resources, contexts: torch.Tensor) -> torch.Tensor:
    """Cosine of each context with every tool through the FAISS index, ``[B, N]``."""
    return res.tool_index.dense_scores(contexts)
