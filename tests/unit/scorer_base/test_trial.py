"""Trial conversations (tracer/scorer_base/trial.py) and the guard that judges on them
(Guard.judge): which conversations are trials, what a trial step shows, and that the guard compares the
two rankings on trial steps alone once the logs hold enough of them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tracer.core.types import Step, Trajectory
from tracer.scorer_base.trial import EXPLORED, check_rate, explored_ids, on_trial, widened
from tracer.scorers.tracer_plus.guard import TRIAL_MARGIN, TRIAL_MIN_STEPS
from tracer.scorers.tracer_plus.inner_folds import CandidateData
from tracer.scorers.tracer_plus.zero_shot import ZeroShot


def test_a_conversation_is_a_trial_by_its_id_alone_at_the_rate_asked():
    ids = [f"conversation-{i}" for i in range(20_000)]
    drawn = [on_trial(c, 0.1) for c in ids]
    assert drawn == [on_trial(c, 0.1) for c in ids]              # no state: the same id, the same answer
    share = sum(drawn) / len(ids)
    assert abs(share - 0.1) < 4 * math.sqrt(0.1 * 0.9 / len(ids))  # a uniform draw: within 4 SE of the rate
    assert not any(on_trial(c, 0.0) for c in ids[:100]) and all(on_trial(c, 1.0) for c in ids[:100])
    # a trial at rate r is a trial at every larger rate (one draw per id, compared with the rate)
    assert all(on_trial(c, 0.3) for c, d in zip(ids, drawn) if d)
    assert [on_trial(c, 0.1, seed=1) for c in ids] != drawn       # another seed, other conversations


def test_a_trial_step_shows_the_served_top_k_then_the_others_not_among_them():
    assert widened([4, 2, 7], [2, 9, 4, 1, 8], 3) == [4, 2, 7, 9]   # the other's top 3 is 2, 9, 4
    assert widened([1, 2], [1, 2], 2) == [1, 2]                    # the same ranking: nothing more
    assert widened([], [5, 6], 2) == [5, 6]


def test_the_log_marks_trials_and_a_rate_outside_0_1_is_refused():
    a = Trajectory("a", "g", "d", (), metadata={EXPLORED: True})
    b = Trajectory("b", "g", "d", (), metadata={EXPLORED: "yes"})   # only True marks a trial
    assert explored_ids([a, b, Trajectory("c", "g", "d", ())]) == {"a"}
    for bad in (-0.1, 1.5, True, "0.1"):
        with pytest.raises(ValueError, match="zero_shot.trial"):
            check_rate(bad, "zero_shot.trial")
    with pytest.raises(ValueError, match="zero_shot.trial"):
        ZeroShot("hybrid", trial=2.0)


def _steps(ids: list[str]) -> list[Step]:
    return [Step(t, t, 0, 0, (), (), "x", ()) for t in ids]


def test_the_guard_judges_on_trial_steps_alone_once_there_are_enough():
    z = ZeroShot("hybrid", guard=True, k=1, trial=0.1)
    n_trial, n_own = TRIAL_MIN_STEPS, 60
    # the logs of a gateway that served the zero-shot ranking: on its own steps it presented every gold
    # (1.0) and the model ranks the gold first on half of them; on the trial steps the zero-shot ranking
    # presented 1 in 3 and the model every gold
    steps = _steps([f"t{i}" for i in range(n_trial)] + [f"o{i}" for i in range(n_own)])
    explored = {f"t{i}" for i in range(n_trial)}
    s = len(steps)
    model_first = np.r_[np.ones(n_trial, bool), np.arange(n_own) % 2 == 0]
    inner = torch.tensor([[1.0, 0.0] if hit else [0.0, 1.0] for hit in model_first])        # [S, 2]
    zero_hits = np.r_[np.arange(n_trial) % 3 == 0, np.ones(n_own, bool)]                   # [S]
    order = torch.randperm(s, generator=torch.Generator().manual_seed(0))  # rows come fold by fold
    gold = torch.zeros(s, dtype=torch.long)                   # candidate 0 is every step's gold
    data = CandidateData(torch.zeros(s, 2, 1), torch.ones(s, 2, dtype=torch.bool), gold,
                         torch.zeros(s, dtype=torch.long), torch.tensor([[0, 1]] * s), order)
    on_trials = z.judge(inner[order], data, zero_hits, steps, explored)
    assert on_trials["guard_steps"] == "trial" and on_trials["guard_n"] == n_trial
    assert on_trials["guard_model_recall"] == 1.0
    assert on_trials["guard_zero_shot_recall"] == pytest.approx(10 / 30)
    assert on_trials["serves"] == "model"
    # the paired difference's error: d = 1 on 20 steps, 0 on 10, var 2/9
    assert on_trials["guard_se"] == pytest.approx(math.sqrt((2 / 9) / 30))
    # a lead of one step in 30 with three discordant steps (the model misses step 0, the fusion steps 1
    # and 2): d = -1, +1, +1, 0 ...; mean 1/30 under the paired error sqrt((3/30 - 1/900) / 30) = 0.057
    model_close = np.r_[np.arange(n_trial) != 0, np.arange(n_own) % 2 == 0]
    inner_close = torch.tensor([[1.0, 0.0] if hit else [0.0, 1.0] for hit in model_close])
    zero_close = np.r_[(np.arange(n_trial) != 1) & (np.arange(n_trial) != 2), np.ones(n_own, bool)]
    near = z.judge(inner_close[order], data, zero_close, steps, explored)
    assert near["guard_se"] == pytest.approx(math.sqrt((3 / 30 - 1 / 900) / 30))
    assert near["serves"] == "zero_shot" and TRIAL_MARGIN == 1.0
    # the same logs judged over every step: the serving ranking wins by construction
    every = z.choose(inner, gold, zero_hits)
    assert every["serves"] == "zero_shot" and every["guard_model_recall"] == pytest.approx(60 / 90)
    # too few trial steps: the others alone (a trial step, logged where either ranking presented the gold,
    # would tilt the serving ranking's own steps toward the model), and the history says so
    fewer = set(sorted(explored)[:TRIAL_MIN_STEPS - 1])
    few = z.judge(inner[order], data, zero_hits, steps, fewer)
    rest = np.array([t.trajectory_id not in fewer for t in steps])
    assert few == {**z.choose(inner[torch.from_numpy(rest)], gold[:int(rest.sum())], zero_hits[rest]),
                   "guard_steps": "not_trial", "guard_n": int(rest.sum())}
    assert few["serves"] == "zero_shot" and few["guard_n"] == s - TRIAL_MIN_STEPS + 1
    # no trial at all (complete logs of another system): the guard as it always was, nothing added
    unmarked = z.judge(inner[order], data, zero_hits, steps, set())
    assert unmarked == z.choose(inner[order], gold, zero_hits) and "guard_steps" not in unmarked
