"""The guard: whether tracer_plus serves its candidate model or its zero-shot ranking
(:mod:`tracer.scorers.tracer_plus.zero_shot`).

The *guard* decides at fit time, from the inner folds the candidate model was trained on: it compares the
model's out-of-fold recall@k on the training steps (the gold among the top k of its candidates by the
model's score, every step counted, a gold outside the candidates a miss) with the zero-shot ranking's on the
same steps, and serves the model only when it is ahead by more than one standard error of the difference
(few logs, few steps, a wide error: the model must earn its place). The candidates are out of fold; the
model's weights are the served ones, which saw every training step, so on few logs its recall there
overstates what it serves, and the one-error margin is what holds it back (judging it on models cross-fitted
over the inner folds instead lost more recall than it won: experiments/studies/learning_curves/README.md).
With a dataset's worth of logs the model wins by a wide margin and nothing changes (the committed full-data
rows reproduce); with five trajectories it rarely does. Transferred weights (``transfer``, learned on other
datasets) face the same comparison on the logs they are fitted with, scored out of fold by the loaded model,
with the burden reversed: they serve unless the zero-shot ranking leads by more than one standard error. The
decision is a fit result (``history["serves"]``): saved with the index, taken over by an online refit.

*Trials* (``trial: r``, 0 = off). On a gateway's own logs every logged step is one the serving ranking got
right, so the guard's comparison over every step keeps whichever ranking serves. On a share ``r`` of the
conversations a gateway shows the other ranking's top k after the served k (:mod:`tracer.scorer_base.trial`,
:meth:`tracer.retriever.Retriever.select_ids` with the conversation's id) and marks them in its log; once the
logs hold :data:`TRIAL_MIN_STEPS` of their steps, the guard compares the two rankings on those steps alone,
where both were shown (:meth:`Guard.judge`). Logs that hold no trial (another system's) are judged as
before.

*The gate* (``gate: true``). A gateway's own logs stop where a conversation derailed, so the model learned
from them knows the early steps of conversations and little after (docs/learning.md, "What a gateway's own
logs can and cannot teach", measures it on tau2). With the gate, on logs that hold trials, a step whose first
key's state has no logged child is ranked by the zero-shot fusion, and the guard judges the model as it
would then serve. Models fitted on complete logs (no trial) are not gated: there the prefix key misses many
BFCL steps that the other keys know.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tracer.core.types import Step
from tracer.learn.nll import IGNORE

TRIAL_MIN_STEPS = 30   # trial steps the guard needs before it judges on them alone
# on trial steps, the lead the guard asks for, in standard errors of the paired difference. One is safe with
# the gate, which keeps the model to the states its logs know; without the gate a model that led by one on
# tau2's trial steps fell 0.22 below the start (docs/learning.md)
TRIAL_MARGIN = 1.0


class Guard:
    """The guard's decisions, read off the settings of :class:`~tracer.scorers.tracer_plus.zero_shot.ZeroShot`
    that holds them: ``guard`` (on or off), ``k`` (the recall@k compared) and ``gate``."""

    guard: bool
    k: int
    gate: bool

    def choose(self, inner_scores: torch.Tensor, gold: torch.Tensor, zero_hits: np.ndarray,
               transferred: bool = False, paired: bool = False, state: torch.Tensor | None = None) -> dict:
        """The guard's decision from the model's out-of-fold scores ``[S, C]`` (-inf where masked), the gold's
        candidate index ``[S]`` (IGNORE: not a candidate) and the zero-shot ranking's hits ``[S]`` (bool).
        A model trained on these few logs must lead by more than one standard error; ``transferred`` weights,
        learned on much more elsewhere, serve unless the zero-shot ranking leads by as much.

        ``paired``: ``zero_hits`` is row-aligned with the scores (the same steps, both rankings shown: trial
        steps, :meth:`judge`); the error is the paired difference's and the lead must exceed
        :data:`TRIAL_MARGIN` of them.
        ``state [S]`` (bool, row-aligned like ``zero_hits``): with ``gate``, the steps whose state the logs
        know; the model is judged as it serves, by the zero-shot ranking's hit on every other step (on a
        gateway's own logs, :meth:`judge`)."""
        safe = gold.clamp_min(0)
        g = inner_scores.gather(1, safe[:, None])                                         # [S, 1]
        better = (inner_scores > g).sum(1)                                                # [S]
        model_hits = ((gold != IGNORE) & (better < self.k)).float()
        m, z = model_hits.numpy().astype(np.float64), np.asarray(zero_hits, dtype=np.float64)
        if self.gate and state is not None:
            m = np.where(state.numpy(), m, z)
        model, zero = (float(m.mean()) if len(m) else 0.0), (float(z.mean()) if len(z) else 0.0)
        if paired:
            se = float(np.sqrt((m - z).var() / len(m))) if len(m) else float("inf")
            margin = TRIAL_MARGIN * se
        else:  # the model must earn its place: ahead by more than one standard error of the difference
            se = float(np.sqrt(m.var() / len(m) + z.var() / len(z))) if len(m) and len(z) else float("inf")
            margin = se
        behind = zero - model > margin if transferred else model - zero <= margin
        serves = "zero_shot" if self.guard and behind else "model"
        return {"serves": serves, "guard_model_recall": model, "guard_zero_shot_recall": zero, "guard_se": se}

    def judge(self, inner_scores: torch.Tensor, data, zero_hits: np.ndarray, steps: Sequence[Step],
              explored: set[str], transferred: bool = False) -> dict:
        """:meth:`choose` over the training steps of trial conversations (``explored``: their trajectory ids,
        :mod:`tracer.scorer_base.trial`) where the logs hold at least :data:`TRIAL_MIN_STEPS` of them, else
        over the other steps (every step where there is no trial). ``data``: the out-of-fold candidates
        (``CandidateData``: ``gold``, ``step`` and ``state`` per row, row-aligned with
        ``inner_scores [S, C]``); ``zero_hits [S]`` in the order of ``steps``.

        Why: on a gateway's own logs every logged step is one the serving ranking got right, so over every
        step the serving ranking wins by construction; on trial steps both rankings were presented."""
        # [R] row order (the rows come inner fold by inner fold)
        hits = np.asarray(zero_hits)[data.step.numpy()] if data.step is not None else np.asarray(zero_hits)
        if not explored:  # complete logs of another system: the model serves every step it is chosen for
            return self.choose(inner_scores, data.gold, hits, transferred)
        on = np.array([s.trajectory_id in explored for s in steps], dtype=bool)[data.step.numpy()]   # [R]
        n = int(on.sum())
        # too few trial steps yet: the other steps alone, as with no trial. A trial step is logged where
        # either ranking presented the gold, so among the serving ranking's own steps it would tilt toward
        # the other
        on_trials = n >= TRIAL_MIN_STEPS
        rows = on if on_trials else ~on
        keep = torch.from_numpy(rows)
        state = None if data.state is None else data.state[keep]
        out = self.choose(inner_scores[keep], data.gold[keep], hits[rows], transferred, paired=on_trials,
                          state=state)
        return {**out, "guard_steps": "trial" if on_trials else "not_trial", "guard_n": int(rows.sum())}

    def hits(self, zs: np.ndarray, gold_ids: np.ndarray) -> np.ndarray:
        """``[S]`` whether each step's gold is among the top k of its zero-shot scores ``zs [S, N]``."""
        g = zs[np.arange(len(gold_ids)), gold_ids][:, None]
        n = zs.shape[1]
        ahead = (zs > g).sum(1) + ((zs == g) & (np.arange(n)[None, :] < gold_ids[:, None])).sum(1)
        return ahead < self.k
