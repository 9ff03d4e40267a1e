"""The one interface every tool selector shares, with every optional capability declared.

A scorer is fitted on training trajectories and, for a batch of decision steps, returns
:class:`~tracer.scorer_base.records.Scores`. Callers (the evaluation, :class:`tracer.retriever.Retriever`,
the online updater, the gateway) use only what :class:`Scorer` declares; nothing is probed with
``getattr``. :class:`ScorerBase` gives every capability a default, so a scorer states what it
changes:

- ``pad``, ``global_set`` (always-present registry ids), ``successful_only``: presentation and
  training settings, with the defaults of a plain scorer (pad, no global set, successful only).
- ``rendering``: how a step's context is rendered to embed it (``None``: the scorer embeds nothing
  through :meth:`Scorer.embed`).
- ``embed(steps) -> Contexts``: the embedded contexts the scorer reads, a tuple of ``[B, d]``
  tensors (one per rendering; tracer_plus has two). ``score(steps)`` is
  ``score_embedded(steps, *embed(steps))``; a scorer overrides one of the two.
- ``select_one`` / ``rank_one``: one live step from its embedded contexts (``embed([step])``). The
  default is the batched path with a batch of one; the tracer family overrides them with the
  single-step path of :mod:`tracer.scorer_base.single_step` (tested equal to the batched one).
- ``can_save``: whether ``save(directory)`` / ``cls.load(directory, embedder)`` exist for it: declared once,
  on the class, and held to the class's own ``save`` when the class is defined (:class:`ScorerBase`);
  :func:`tracer.retriever.saveable_scorers` reads the scorer configs that can save off their classes.
- ``describe() -> dict``: the configuration and what fitting produced, for reports.
- Learning while serving (:mod:`tracer.online`): ``memory_tables()`` (the tries and transition tables the
  scorer reads, which logged steps are added to), ``memory_contexts(steps, res)`` (the ``[S, d]`` contexts its
  tries store; ``None`` for count-only tables), ``reattach(tables, res, touched)`` (use the updated tables
  over ``res``), ``learned_part`` (the attribute holding weights a refit learns again, or ``None``),
  ``adopt(fresh)`` (take a refitted scorer's learned part in place of its own) and ``updatable``
  (``False``: the scorer is refitted, never updated in place).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from tracer.core.context import ContextRendering
from tracer.core.types import Step, Trajectory
from tracer.memory.transitions import TransitionTable
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources

Contexts = tuple[torch.Tensor, ...]  # embedded contexts of B steps, each [B, d]


@runtime_checkable
class Scorer(Protocol):
    """A tool selector: fitted once, then scores batches of steps (see the module docstring)."""

    name: str
    pad: bool
    global_set: tuple[int, ...]
    successful_only: bool
    rendering: ContextRendering | None
    can_save: bool
    res: Resources | None

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport: ...

    def embed(self, steps: Sequence[Step]) -> Contexts: ...

    def score(self, steps: Sequence[Step]) -> Scores: ...

    def score_embedded(self, steps: Sequence[Step], *contexts: torch.Tensor) -> Scores: ...

    def select_one(self, step: Step, contexts: Contexts, k: int,
                   pad: bool | None = None) -> tuple[int, ...]: ...

    def rank_one(self, step: Step, contexts: Contexts, top: int | None = None) -> np.ndarray: ...

    def describe(self) -> dict: ...

    def save(self, directory: str | Path) -> Path: ...

    updatable: bool
    learned_part: str | None

    def memory_tables(self) -> list[TransitionTable]: ...

    def memory_contexts(self, steps: Sequence[Step], res: Resources) -> torch.Tensor | None: ...

    def reattach(self, tables: Sequence[TransitionTable], res: Resources,
                 touched: tuple | None = None) -> None: ...

    def adopt(self, fresh: Scorer) -> None: ...


class ScorerBase:
    """Defaults for every capability :class:`Scorer` declares; a scorer overrides what it changes and
    implements ``fit`` and one of ``score`` / ``score_embedded``."""

    name: str = "scorer"
    pad: bool = True
    global_set: tuple[int, ...] = ()
    successful_only: bool = True
    rendering: ContextRendering | None = None
    can_save: ClassVar[bool] = False
    res: Resources | None = None
    updatable: ClassVar[bool] = True
    # the attribute a refit learns again (tracer_plus: "model", tracer: "head")
    learned_part: str | None = None

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.score is ScorerBase.score and cls.score_embedded is ScorerBase.score_embedded:
            raise TypeError(f"{cls.__name__} must implement score or score_embedded")
        # can_save is the one statement of whether a scorer saves: it must agree with the class's save
        if cls.can_save != (cls.save is not ScorerBase.save):
            raise TypeError(f"{cls.__name__} declares can_save = {cls.can_save} but "
                            f"{'inherits' if cls.save is ScorerBase.save else 'implements'} save: "
                            "declare can_save = True exactly when the class implements save and load")

    def _check_fitted(self) -> None:
        if self.res is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted: call fit(trajectories, resources)")

    def embed(self, steps: Sequence[Step]) -> Contexts:
        """``(contexts [B, d],)`` under :attr:`rendering`; ``()`` for a scorer that embeds nothing here."""
        self._check_fitted()
        return () if self.rendering is None else (self.res.embed(steps, self.rendering),)

    def score(self, steps: Sequence[Step]) -> Scores:
        self._check_fitted()
        return self.score_embedded(steps, *self.embed(steps))

    def score_embedded(self, steps: Sequence[Step], *contexts: torch.Tensor) -> Scores:
        """Score steps whose contexts are embedded; by default the scorer embeds by itself (``contexts``
        unused)."""
        return self.score(steps)

    def select_one(self, step: Step, contexts: Contexts, k: int, pad: bool | None = None) -> tuple[int, ...]:
        """The presented set of one step (registry ids), exactly as :func:`finalize` presents it."""
        pad = self.pad if pad is None else pad
        return finalize(self.score_embedded([step], *contexts), k, pad).presented[0]

    def rank_one(self, step: Step, contexts: Contexts, top: int | None = None) -> np.ndarray:
        """The ranking of one step, registry ids best first (the first ``top`` only when given)."""
        ranking = finalize(self.score_embedded([step], *contexts), 1).ranking[0].numpy()
        return ranking if top is None else ranking[:top]

    def describe(self) -> dict:
        return {"scorer": self.name}

    # ---- learning while serving (tracer.online): a scorer without tables only follows its resources --------
    def memory_tables(self) -> list[TransitionTable]:
        return []

    def memory_contexts(self, steps: Sequence[Step], res: Resources) -> torch.Tensor | None:
        return None

    def reattach(self, tables: Sequence[TransitionTable], res: Resources,
                 touched: tuple | None = None) -> None:
        self.res = res

    def adopt(self, fresh: Scorer) -> None:
        """Take the learned part of ``fresh`` (a scorer of this config fitted on more trajectories) in place
        of this one's: one assignment, so a step is scored by the old weights or the new, never a mix."""
        setattr(self, self.learned_part, getattr(fresh, self.learned_part))

    def save(self, directory: str | Path) -> Path:
        raise TypeError(f"scorer {self.name!r} ({type(self).__name__}) cannot be saved: only scorers "
                        "with can_save can (tracer.retriever.saveable_scorers() names them); rebuild this "
                        "one from its data")
