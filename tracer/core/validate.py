"""Validation at the edge: the rules every public entry point applies to its inputs, in one place.

The rules (docs/storage.md, "Bad input"):

- ``k`` is an ``int >= 1`` (``bool`` is refused); a ``k`` larger than the registry presents the
  whole registry.
- The settings of a run (``evaluate.py``, ``train.py``): ints, optional ints, true/false and rates, each
  named as the override that sets it (:func:`check_config`).
- OpenAI chat messages obey the message model of :mod:`tracer.core.messages` (strict for datasets, read
  leniently for live traffic by :mod:`tracer.core.live`).

A broken message rule raises :class:`InvalidField` (a ``ValueError``) naming the field; the dataset reader
turns it into a :class:`~tracer.core.errors.DataError` with file, line and record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class InvalidField(ValueError):
    """An input that breaks a rule; ``field`` is its location (``messages[2].content``)."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


def check_int(value: Any, name: str, minimum: int) -> int:
    """An int >= ``minimum``, else an error naming it: TypeError for another type (bool, float, str),
    ValueError for a smaller int."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def check_k(k: Any, name: str = "k") -> int:
    """``k`` as an int >= 1 (see :func:`check_int`)."""
    return check_int(k, name, 1)


# config keys of evaluate.py / train.py checked before any work: key -> smallest value. train.py's config is
# evaluate.py's (its held-out run) plus the index's own keys, so it is checked by the same rules, save folds
# (0: no held-out run)
EVAL_INTS = {"k": 1, "folds": 2, "seed": 0, "latency_sample": 0}
TRAIN_INTS = {**EVAL_INTS, "folds": 0}
# set in the config or null (their default): key (dotted for a nested one) -> smallest value
OPTIONAL_INTS = {"train_trajectories": 0, "regime.max_steps_per_turn": 1}
BOOLS = ("test_successful_only", "holdout_tools", "insight", "progress", "save_index")
RATES = ("max_executor_error_rate",)  # a number in [0, 1]


def check_config(cfg: Mapping[str, Any], ints: Mapping[str, int]) -> None:
    """The plain settings of a run config (ints, optional ints, true/false, rates), each named as the
    command-line override that sets it (``k (override k=...) must be an int >= 1, got 0``): what
    ``evaluate.py`` and ``train.py`` check before any work, so that a bad override costs no loading and
    leaves no outputs."""
    for key, minimum in ints.items():
        if key in cfg:
            check_int(cfg[key], f"{key} (override {key}=...)", minimum)
    if ints is TRAIN_INTS and cfg.get("folds") == 1:
        raise ValueError("folds (override folds=...) must be 0 (no held-out ablation) or >= 2, got 1")
    for key, minimum in OPTIONAL_INTS.items():
        value = _dotted(cfg, key)
        if value is not None:
            check_int(value, f"{key} (override {key}=...)", minimum)
    for key in BOOLS:
        if key in cfg and not isinstance(cfg[key], bool):
            raise TypeError(f"{key} (override {key}=...) must be true or false, got {cfg[key]!r}")
    for key in RATES:
        value = cfg.get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key in cfg and not (number and 0 <= value <= 1):
            raise ValueError(f"{key} (override {key}=...) must be a number in [0, 1], got {value!r}")


def _dotted(cfg: Mapping[str, Any], key: str) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"``; None where a level is missing or null."""
    for part in key.split("."):
        if not isinstance(cfg, Mapping):
            return None
        cfg = cfg.get(part)
    return cfg
