"""How tracer_plus serves from a gateway's own logs: the trials that let its guard compare the model with
the zero-shot fusion where both were shown, and the gate that keeps the model to the states those logs
know (:mod:`tracer.scorer_base.trial`, :mod:`tracer.scorers.tracer_plus.guard`; measured in docs/learning.md,
"What a gateway's own logs can and cannot teach")."""

from __future__ import annotations

from collections.abc import Sequence

from tracer.core.types import Step
from tracer.scorer_base.ranking import finalize


class OwnLogs:
    """The trial and gate methods of :class:`~tracer.scorers.tracer_plus.scorer.TracerPlusScorer`, which
    holds the state they read (``zero``, ``history``, ``cold``, ``zero_shot_only``, ``pad``) and implements
    :class:`tracer.scorer_base.trial.Trials` through them."""

    @property
    def trial_rate(self) -> float:
        """The share of conversations a gateway runs as trials (``zero_shot.trial``)."""
        return self.zero.trial

    @property
    def trial_ready(self) -> bool:
        """Whether there are two rankings to try: a model trained on logs and judged by the guard."""
        return self.zero.guard and "guard_model_recall" in self.history and not self.cold

    def trial_rankings(self, steps: Sequence[Step], k: int) -> list[list[int]]:
        """Each step's top k under the ranking the guard did not choose (registry ids, best first)."""
        other = "model" if self.zero_shot_only else "zero_shot"
        selection = finalize(self.score_embedded(steps, *self.embed(steps), serving=other), k, self.pad)
        return [list(p) for p in selection.presented]

    @property
    def gates(self) -> bool:
        """``zero_shot.gate`` on logs that hold trial conversations (a gateway's own, whose conversations end
        where they derailed): the model serves only the steps whose state those logs know."""
        return self.zero.gate and bool(self.history.get("own_logs"))
