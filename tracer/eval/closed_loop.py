"""The closed loop: a deployment that starts with no logs and learns only from what it presented (issue 55).

Every other regime fits on complete logs of another system. A gateway logs only the calls of tools it
presented: a tool it never shows is never called, so never logged, so never learned. This regime measures
learning from one's own presentations:

1. The scorer is fitted on **no** trajectory over the dataset's registry (tracer_plus then serves its
   zero-shot ranking). A scorer that cannot be fitted on nothing (AutoTool, ToolNet: transition counts, none
   to count) serves the vector ranking over its own context rendering (what it serves with no transition
   evidence) until a logged conversation holds a step it can learn from; it is then fitted on the logs so far.
2. The dataset's conversations arrive in a seeded order (``arrival_order(trajectories, seed, 0)``). Each
   conversation's steps are scored **before** the conversation is learned (prequential), under teacher forcing
   (a step's context is the gold history).
3. The conversation is then logged as the gateway would (:func:`presented_log`) and learned at once
   (:meth:`Updater.update`, synchronous); the learned part is refitted after the scheduled numbers of
   conversations (:meth:`ClosedLoopConfig.refit_counts`).

Feedback variants: ``presented_success`` logs the conversation up to, not including, the assistant message of
the first call whose tool was not presented at its step (the model cannot call what it was not shown), as a
success; ``presented_failure`` logs the same cut as a failure when it was cut (the outcome went unreported),
so a scorer that learns from successful trajectories only (``successful_only``, the default of every learner
here) learns nothing from a cut conversation; ``full`` logs the whole conversation (complete logs of another
system, the baseline). The presented set under this regime is the oracle's view: the gold tool is called when
presented.

*Trials* (a scorer that runs them, :mod:`tracer.scorer_base.trial`; tracer_plus's ``zero_shot.trial``): on a
seeded share of the conversations, once the learner has two rankings to try, each step shows the serving
ranking's top k and then the other ranking's top k (``LoopStep.explored``); the log marks the conversation as
a trial. A trial step counts as a hit in the stream's recall@k only when the served top k held the gold; the
conversation is cut where neither showed it. Under ``full`` no conversation is a trial.

Beside each step the learner's *zero-shot start* ranks it: the same scorer fitted on no logs and never updated
(the ranking it would serve with no logs), so a report can check that learning never costs recall.
The report's fields are computed by :func:`tracer.eval.closed_loop_report.stream_report`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from tracer.build import build_scorer
from tracer.core.folds import arrival_order
from tracer.core.steps import extract_steps, iter_calls
from tracer.core.types import Step, Trajectory
from tracer.data import Dataset
from tracer.online.updater import Updater
from tracer.scorer_base.protocol import Scorer
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.resources import Resources, training_steps
from tracer.scorer_base.trial import EXPLORED, Trials, on_trial, widened

FEEDBACK = ("presented_success", "presented_failure", "full")


@dataclass(frozen=True)
class ClosedLoopConfig:
    """``refit_at``: refit after these numbers of conversations; then at ``refit_growth`` times the last
    one, again and again (None: no more). ``window``: steps per report window. ``seed``: the arrival
    order's."""

    k: int = 5
    seed: int = 0
    feedback: str = "presented_success"
    refit_at: tuple[int, ...] = (10, 25, 50, 100)
    refit_growth: int | None = 2
    window: int = 200
    successful_only: bool = True   # steps of failed conversations are not counted (their calls are not gold)
    batch_size: int = 512
    progress: bool = True

    def __post_init__(self):
        if self.feedback not in FEEDBACK:
            raise ValueError(f"feedback must be one of {', '.join(FEEDBACK)}, got {self.feedback!r}")
        if any(b <= a for a, b in zip(self.refit_at, self.refit_at[1:])) or any(c < 1 for c in self.refit_at):
            raise ValueError(f"refit_at must be increasing counts >= 1, got {list(self.refit_at)}")
        if self.refit_growth is not None and self.refit_growth < 2:
            raise ValueError(f"refit_growth must be an int >= 2 or null, got {self.refit_growth}")

    def refit_counts(self, n: int) -> list[int]:
        """The numbers of conversations after which a refit runs, up to ``n``."""
        out = [c for c in self.refit_at if c <= n]
        c = self.refit_at[-1] if self.refit_at else 1
        while self.refit_growth is not None and (c := c * self.refit_growth) <= n:
            out.append(c)
        return out


@dataclass
class LoopStep:
    """One scored step of the stream (one line of ``steps.jsonl``)."""

    position: int                 # index among the stream's scored steps
    conversation: int             # arrival index of its conversation
    trajectory_id: str
    step: int                     # index of the call within its conversation
    gold: str
    gold_rank: int | None         # 1-based rank of the gold in the full ranking
    presented: list[str]
    counted: bool                 # in the metrics (a step of a successful conversation)
    serves: str | None = None     # what the learner served: "model", "zero_shot", "standin" (None: unsaid)
    zero_shot_rank: int | None = None      # the gold's rank under the zero-shot start
    zero_shot_hit: bool | None = None      # the gold in the zero-shot start's presented set
    explored: list[str] = field(default_factory=list)  # a trial step's tools shown beyond ``presented``

    @property
    def shown(self) -> bool:
        """Whether the gold was shown to the model: presented, or among a trial's further tools."""
        return self.hit or self.gold in self.explored

    @property
    def hit(self) -> bool:
        return self.gold in self.presented

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class LoggedConversation:
    conversation: int
    trajectory_id: str
    n_calls: int
    cut_at: int | None            # index of the first call not presented (None: every call was presented)
    logged_messages: int          # messages of the logged trajectory
    logged_calls: int             # its calls (``n_calls`` under ``full``, else ``cut_at`` when there is one)
    logged_success: bool
    trial: bool = False           # a trial conversation (tracer/scorer_base/trial.py): both rankings shown

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class ClosedLoopResult:
    steps: list[LoopStep]
    conversations: list[LoggedConversation]
    refits: list[dict]            # the Updater's refits: trajectories, seconds, error (text) where one failed
    refit_counts: list[int]       # the schedule
    scorer_info: dict = field(default_factory=dict)   # the learner's describe() at the end
    standin: str | None = None    # what served before the scorer could be fitted (None: fitted on no logs)


def presented_log(traj: Trajectory, presented: Sequence[bool],
                  feedback: str) -> tuple[Trajectory, int | None]:
    """The trajectory as a gateway logs it, and the index of its first unpresented call (None: none).

    ``presented[i]``: whether call ``i`` (in :func:`iter_calls` order) named a tool presented at its step.
    The cut keeps the messages before the assistant message holding that call."""
    calls = list(iter_calls(traj.messages))
    if len(presented) != len(calls):
        raise ValueError(f"{traj.id}: {len(presented)} presented flags for {len(calls)} calls")
    cut = next((i for i, p in enumerate(presented) if not p), None)
    if feedback == "full" or cut is None:
        return traj, cut
    failed = feedback == "presented_failure"
    return dataclasses.replace(traj, messages=traj.messages[:calls[cut][0]],
                               success=traj.success and not failed,
                               reward=0.0 if failed else traj.reward), cut


class Learner:
    """One scorer as a deployment runs it: fitted on no logs, then updated conversation by conversation."""

    def __init__(self, make_scorer: Callable[[], Scorer], res: Resources):
        self.res, self.scorer, self.logs = res, make_scorer(), []
        self.standin: Scorer | None = None
        self.updater: Updater | None = None
        try:
            self.scorer.fit([], res)
        except ValueError:  # nothing to fit on (transition counts): the vector ranking over its rendering
            rendering = self.scorer.rendering
            self.standin = build_scorer("vector", **({"context": dataclasses.asdict(rendering)}
                                                     if rendering is not None else {}))
            self.standin.fit([], res)
        else:
            self.updater = Updater(self.scorer, background=False)

    @property
    def serving(self) -> Scorer:
        return self.standin if self.standin is not None else self.scorer

    def on_trial(self, conversation: str, cfg: ClosedLoopConfig) -> bool:
        """Whether this conversation is a trial: a learner that runs them, with two rankings to try, and
        logs of its own (complete logs of another system hold no trials)."""
        serving = self.serving
        return (cfg.feedback != "full" and isinstance(serving, Trials) and serving.trial_ready
                and on_trial(conversation, serving.trial_rate, self.res.seed))

    def serves(self) -> str | None:
        return "standin" if self.standin is not None else self.scorer.describe().get("serves")

    def learn(self, traj: Trajectory) -> None:
        self.logs.append(traj)
        if self.updater is not None:
            self.updater.update([traj])
        elif training_steps(self.logs, self.res.registry, self.scorer.successful_only):
            self.scorer.fit(self.logs, self.res)
            self.updater, self.standin = Updater(self.scorer, background=False, history=self.logs), None

    def refit(self) -> None:
        """Refit the learned part now; a failed refit is recorded in the updater's ``refits`` (the old weights
        keep serving)."""
        if self.updater is not None and self.updater.refits_anything:
            try:
                self.updater.refit(wait=True)
            except RuntimeError:
                pass

    @property
    def refits(self) -> list[dict]:
        entries = self.updater.refits if self.updater is not None else []
        return [{k: str(v) if k == "error" else v for k, v in e.items()} for e in entries]


def rank_steps(scorer: Scorer, steps: Sequence[Step], k: int) -> tuple[list[int | None], list[list[str]]]:
    """Each step's gold rank (1-based, None: not ranked) and presented tool names."""
    sel = finalize(scorer.score(steps), k, scorer.pad)
    reg = scorer.res.registry
    gold = torch.tensor([reg.id(s.gold) for s in steps])                               # [B]
    hit = sel.ranking == gold[:, None]                                                 # [B, N]
    ranks = [int(h.float().argmax()) + 1 if h.any() else None for h in hit]
    return ranks, [[reg.names[j] for j in p] for p in sel.presented]


def run_closed_loop(dataset: Dataset, make_scorer: Callable[[], Scorer], res: Resources,
                    cfg: ClosedLoopConfig) -> ClosedLoopResult:
    """Stream ``dataset``'s conversations through a scorer fitted on no logs (see the module docstring)."""
    order = arrival_order(dataset.trajectories, cfg.seed, 0)
    learner, start = Learner(make_scorer, res), Learner(make_scorer, res)  # start: never learns
    standin = type(learner.standin).__name__ if learner.standin is not None else None
    schedule = cfg.refit_counts(len(order))
    registry = res.registry
    records: list[LoopStep] = []
    scored: list[Step] = []          # the steps of ``records``, for the zero-shot start
    conversations = []
    for c, traj in enumerate(tqdm(order, desc="closed loop", disable=not cfg.progress)):
        steps = extract_steps(traj)
        known = [s for s in steps if s.gold in registry]  # a tool outside the registry is never presented
        ranks, presented = rank_steps(learner.serving, known, cfg.k) if known else ([], [])
        serves = learner.serves()
        trial = bool(known) and learner.on_trial(traj.id, cfg)
        others = ([[registry.names[t] for t in ids] for ids in learner.serving.trial_rankings(known, cfg.k)]
                  if trial else [[] for _ in known])
        shown = dict.fromkeys(range(len(steps)), False)
        counted = traj.success or not cfg.successful_only
        for s, rank, names, other in zip(known, ranks, presented, others):
            record = LoopStep(len(records), c, traj.id, s.index, s.gold, rank, names, counted, serves,
                              explored=widened(names, other, cfg.k)[len(names):])
            shown[s.index] = record.shown
            records.append(record)
        scored.extend(known)
        logged, cut = presented_log(traj, [shown[i] for i in range(len(steps))], cfg.feedback)
        if trial:  # the gateway marks a trial conversation in its log
            logged = dataclasses.replace(logged, metadata={**logged.metadata, EXPLORED: True})
        n_logged = len(list(iter_calls(logged.messages)))
        conversations.append(LoggedConversation(c, traj.id, len(steps), cut, len(logged.messages), n_logged,
                                                logged.success, trial))
        learner.learn(logged)     # after every step of the conversation was scored: prequential
        if c + 1 in schedule:
            learner.refit()
    for lo in range(0, len(scored), cfg.batch_size):
        ranks, presented = rank_steps(start.serving, scored[lo: lo + cfg.batch_size], cfg.k)
        for r, rank, names in zip(records[lo: lo + cfg.batch_size], ranks, presented):
            r.zero_shot_rank, r.zero_shot_hit = rank, r.gold in names
    return ClosedLoopResult(records, conversations, learner.refits, schedule,
                            learner.serving.describe(), standin)


def config_from(cfg: Mapping[str, Any]) -> ClosedLoopConfig:
    """The regime's settings from a composed ``evaluate.yaml`` (``regime=closed_loop``), each error naming the
    command-line override that sets it."""
    reg = cfg.get("regime") or {}

    def name(key: str) -> str:
        return f"regime.{key} (override regime.{key}=...)"

    feedback = reg.get("feedback", "presented_success")
    if feedback not in FEEDBACK:
        raise ValueError(f"{name('feedback')} must be one of {', '.join(FEEDBACK)}, got {feedback!r}")
    refit_at = reg.get("refit_at", [10, 25, 50, 100])
    if not isinstance(refit_at, (list, tuple)) or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                                       for c in refit_at):
        raise ValueError(f"{name('refit_at')} must be a list of ints >= 1, got {refit_at!r}")
    if list(refit_at) != sorted(set(refit_at)):
        raise ValueError(f"{name('refit_at')} must be increasing, got {list(refit_at)}")
    growth = reg.get("refit_growth", 2)
    if growth is not None and (isinstance(growth, bool) or not isinstance(growth, int) or growth < 2):
        raise ValueError(f"{name('refit_growth')} must be an int >= 2 or null, got {growth!r}")
    window = reg.get("window", 200)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"{name('window')} must be an int >= 1, got {window!r}")
    return ClosedLoopConfig(k=cfg["k"], seed=cfg.get("seed", 0), feedback=feedback, refit_at=tuple(refit_at),
                            refit_growth=growth, window=window,
                            successful_only=cfg.get("test_successful_only", True),
                            progress=cfg.get("progress", True))
