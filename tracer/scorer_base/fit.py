"""What ``Scorer.fit`` returns: a record of the fit, so that a fitted scorer keeps only what it scores with.

Training curves and out-of-fold data are the caller's to keep (``train.py`` writes them into its
report); a deployed scorer never holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FitReport:
    """One fit of one scorer.

    scorer: the scorer's name.
    n_trajectories: trajectories passed to ``fit``; ``n_steps``: training steps it learned from.
    seconds: wall time of the fit.
    history: training curves of learned parts, e.g. ``{"train_nll": [...], "val_nll": [...], "best_epoch":
    12}``. data: what a report needs beyond the curves (the blend head's out-of-fold ``StepData``); ``None``
    for most.
    """

    scorer: str
    n_trajectories: int
    n_steps: int
    seconds: float
    history: dict[str, Any] = field(default_factory=dict)
    data: Any = None
