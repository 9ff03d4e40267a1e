"""Trial conversations: what lets a scorer that learns from its own presentations judge itself fairly.

A gateway logs only the calls of tools it presented. A learner that serves one of two rankings (tracer_plus:
its candidate model, or the zero-shot fusion it falls back on) and compares them on its own logs compares
them on steps the serving ranking got right: there the serving ranking's recall@k is 1 by construction, and
the other can only tie or lose. The comparison keeps whichever ranking serves, whether it is better or not
(on BFCL's closed loop the fusion kept serving at stream recall@5 0.797 where the model, served, reached
0.811, and its recall@1 0.631 against 0.440).

A *trial* conversation presents, at each step, the serving ranking's top k and then the other ranking's top
k that are not among them: up to 2k tools, so a trial step never shows less than the serving ranking would.
On a trial step whose gold was called, both rankings' hits are known, and a step where neither presented
the gold is a miss for both: the comparison on trial steps is not tilted toward either ranking. Trials cost
prompt tokens (up to k more tools on a ``rate`` share of conversations), never recall.

Which conversations are trials is a pure function of the conversation's id (:func:`on_trial`), so the
gateway and a refit agree on it without a shared state; the log marks a trial conversation in its
trajectory's metadata (:data:`EXPLORED`), and the fit reads that mark (:func:`explored_ids`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tracer.core.types import Step, Trajectory

EXPLORED = "explored"   # Trajectory.metadata key: the conversation was a trial (bool)


def on_trial(conversation: str, rate: float, seed: int = 0) -> bool:
    """Whether the conversation ``conversation`` (its id) is a trial: a uniform draw in [0, 1) from a hash
    of the id and ``seed``, below ``rate``. The same id always draws the same number (no state kept)."""
    if rate <= 0.0:
        return False
    digest = hashlib.blake2b(f"{seed}:{conversation}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64 < rate


def explored_ids(trajectories: Sequence[Trajectory]) -> set[str]:
    """The ids of the trajectories the log marks as trial conversations."""
    return {t.id for t in trajectories if t.metadata.get(EXPLORED) is True}


def widened(served: Sequence[int], other: Sequence[int], k: int) -> list[int]:
    """A trial step's presented tools: ``served`` (the serving ranking's top k), then the first ``k`` of
    ``other`` that are not among them, in their order."""
    shown = list(served)
    seen = set(shown)
    shown += [t for t in other[:k] if t not in seen]
    return shown


def check_rate(rate: float, name: str) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= float(rate) <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {rate!r}")
    return float(rate)


@runtime_checkable
class Trials(Protocol):
    """A scorer that can run trial conversations: ``trial_rate`` (0: none) and ``trial_ready`` (there is a
    second ranking to try: tracer_plus once its guard has judged a trained model); ``trial_rankings(steps,
    k)`` gives each step's other ranking's top k as registry ids, best first."""

    trial_rate: float

    @property
    def trial_ready(self) -> bool: ...

    def trial_rankings(self, steps: Sequence[Step], k: int) -> list[list[int]]: ...
