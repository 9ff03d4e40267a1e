"""Scorers by name: one registry, one YAML per scorer in ``configs/scorer/``.

Adding a scorer: (1) write ``tracer/scorers/<name>.py`` implementing :class:`Scorer`;
(2) decorate its factory with ``@register_scorer("<name>")``; (3) add ``configs/scorer/<name>.yaml``;
(4) import the module in ``_MODULES`` below. ``tests/test_scorer_registry.py`` keeps (2)-(4) in step.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from tracer.scoring.protocol import Scorer
from tracer.scoring.ranking import finalize, rank
from tracer.scoring.records import Scores, Selection
from tracer.scoring.resources import Resources

SCORERS: dict[str, Callable[..., Scorer]] = {}

_MODULES = ("tracer", "vector", "toolnet", "autotool", "hepm", "insight", "tracer_plus")


def register_scorer(name: str):
    def deco(factory: Callable[..., Scorer]):
        if name in SCORERS:
            raise ValueError(f"scorer {name!r} registered twice")
        SCORERS[name] = factory
        return factory
    return deco


def build_scorer(scorer: str, /, **cfg: Any) -> Scorer:
    """Build a scorer by registry name with its config (the YAML's keys, ``name`` included or not)."""
    if scorer not in SCORERS:
        raise KeyError(f"unknown scorer {scorer!r}; valid names: {', '.join(sorted(SCORERS))}")
    return SCORERS[scorer](**cfg)


for _m in _MODULES:
    try:
        importlib.import_module(f"{__name__}.{_m}")
    except ModuleNotFoundError as _e:  # a scorer module not written yet, never a missing dependency
        if _e.name != f"{__name__}.{_m}":
            raise

__all__ = [
    "SCORERS",
    "Resources",
    "Scorer",
    "Scores",
    "Selection",
    "build_scorer",
    "finalize",
    "rank",
    "register_scorer",
]
