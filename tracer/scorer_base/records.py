"""What a scorer returns for a batch of steps (:class:`Scores`) and what ranking makes of it
(:class:`Selection`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# diagnostics the evaluation writes into their own columns of a step record; every other one goes to ``extra``
RECORDED_DIAGNOSTICS = ("in_trie", "kappa", "depth", "n_children")


@dataclass
class Scores:
    """A scorer's output for B steps over a registry of N tools.

    primary: ``[B, N]`` the scorer's own scores; ``-inf`` for tools it does not propose.
    fallback: ``[B, N]`` vector-search scores, used to rank everything not proposed (padding) and,
        where ``fell_back``, to rank everything.
    fell_back: ``[B]`` the step was ranked by the fallback alone.
    diagnostics: per-step numbers, each ``[B]``, that explain the scores and change no ranking: e.g.
        ``in_trie`` (the state has children), ``kappa`` (confidence), ``depth`` (state length),
        ``n_children``, the blend head's ``w`` and ``T``, tracer_plus's ``in_candidates``. A scorer
        writes only those it has; the evaluation records ``in_trie`` and ``kappa`` in their own
        columns and the rest under ``extra``.

    Presentation (read by :func:`tracer.scorer_base.ranking.finalize` and the evaluation, so declared
    fields rather than diagnostics: they change what the model sees):
    present_all: the whole registry is presented whatever k is (LLM-only, H-EPM, Insight).
    always_present: registry ids added to every presented set (Tracer+G's global set).
    reserve: per step, registry ids that claim the last ``reserve_slots`` slots: the first of them not
        presented before those slots take them (:func:`tracer.scorer_base.ranking.reserved`; tracer_plus's
        slots for tools no log has called).
    guidance: per-step text added to the prompt (H-EPM's suggestion line, Insight's block).
    """

    primary: torch.Tensor
    fallback: torch.Tensor
    fell_back: torch.Tensor
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)
    present_all: bool = False
    always_present: tuple[int, ...] = ()
    reserve: list[tuple[int, ...]] | None = None
    reserve_slots: int = 1
    guidance: list[str] | None = None


@dataclass
class Selection:
    """Rankings and presented sets for B steps."""

    ranking: torch.Tensor              # [B, N] registry ids, best first
    presented: list[tuple[int, ...]]   # per step, registry ids shown to the model
    scores: Scores

    def __len__(self) -> int:
        return self.ranking.shape[0]
