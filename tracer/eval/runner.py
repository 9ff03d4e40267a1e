"""The evaluation loop: k-fold cross-validation by group, teacher-forcing or free-running.

Folds depend only on the groups, ``folds`` and ``seed``, so every scorer run with the same seed
is evaluated on the same steps (paired comparisons). Each fold fits a fresh scorer on the
training groups' trajectories and scores the held-out groups' steps.

- teacher-forcing: every step's context is the benchmark's gold history; a wrong selection never
  corrupts the next step. Steps are scored in batches.
- selection: teacher forcing on a seeded sample of ``sample_steps`` of all folds' test steps, for a real
  model whose every step costs seconds to minutes. The sample depends only on the folds, the seed and
  the dataset, so every scorer and k run with the same seed is asked about the same steps (paired).
- free-running: the executor's own calls are executed by the dataset's environment
  (:mod:`tracer.envs`; BFCL: on BFCL's backends from the task's ``initial_config``) and carried
  forward; the trie state follows the executed calls. The benchmark's rules (turn ends, step cap,
  withheld functions) and its own checker's verdict live in the environment (:mod:`tracer.envs.bfcl`).

A step counts as a correct selection only when the executor's call names a presented tool and
equals the gold; a call to an unpresented tool, a malformed call, an executor error and an answer
without a call are each recorded per step (:func:`.metrics.step_outcome`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from tracer.core.folds import arrival_order, assign_folds, tool_folds, without_tools
from tracer.core.locate import locate
from tracer.core.steps import extract_all, extract_steps, iter_calls, step_from_messages
from tracer.core.threads import one_thread
from tracer.core.types import Step, ToolCall, Trajectory
from tracer.data import Dataset
from tracer.encode.embedders import CachedEmbedder
from tracer.envs.base import Environment
from tracer.eval.metrics import StepRecord, aggregate, fold_metrics, recall_curve, step_outcome
from tracer.eval.tokens import TokenCounter
from tracer.executors import Request
from tracer.scorer_base.protocol import Scorer
from tracer.scorer_base.ranking import finalize
from tracer.scorer_base.records import RECORDED_DIAGNOSTICS
from tracer.scorer_base.resources import Resources


@dataclass(frozen=True)
class EvalConfig:
    k: int = 5
    folds: int = 5
    seed: int = 0
    regime: str = "teacher_forcing"
    max_steps_per_turn: int = 20
    test_successful_only: bool = True
    latency_sample: int = 50
    batch_size: int = 512
    progress: bool = True
    # a cold start: each fold fits on the first N of its training trajectories in a seeded arrival order
    # (the learning curves' order); None: all of them
    train_trajectories: int | None = None
    # tools held out: fold f's training drops every trajectory calling one of fold f's tools (tool_folds)
    holdout_tools: bool = False
    # regime "selection": how many of all folds' test steps to ask about (seeded); None: every one
    sample_steps: int | None = None
    # regime "free_running": how many of all folds' test tasks to run (seeded); None: every one
    sample_tasks: int | None = None


@dataclass
class EvalResult:
    per_fold: list[dict]
    mean: dict
    sd: dict
    records: list[StepRecord]
    tasks: list[dict] = field(default_factory=list)
    recall_curve: list[float] = field(default_factory=list)
    n_steps: int = 0
    trie_based: bool = False
    fit_seconds: list[float] = field(default_factory=list)
    # each fold's scorer, ``describe()`` after its test steps
    scorer_info: list[dict] = field(default_factory=list)


def with_guidance(messages: Sequence[Mapping[str, Any]], guidance: str | None) -> list[Mapping[str, Any]]:
    """Add guidance text to the system prompt (a new system message if there is none)."""
    msgs = list(messages)
    if not guidance:
        return msgs
    if msgs and msgs[0].get("role") == "system":
        return [{**msgs[0], "content": f"{msgs[0].get('content') or ''}\n\n{guidance}"}] + msgs[1:]
    return [{"role": "system", "content": guidance}] + msgs


class Evaluator:
    """Runs one scorer configuration over the folds of one dataset."""

    def __init__(self, dataset: Dataset, scorer_factory: Callable[[], Scorer], res: Resources, executor,
                 cfg: EvalConfig, insight_factory: Callable[[], Any] | None = None,
                 fold_resources: Callable[[Sequence[Trajectory]], Resources] | None = None,
                 environment: Environment | None = None):
        self.ds, self.factory, self.res, self.executor, self.cfg = dataset, scorer_factory, res, executor, cfg
        # free-running's environment: given, or the one the dataset names (None: teacher forcing only)
        self.environment = environment if environment is not None else (
            locate(dataset.environment)() if dataset.environment else None)
        self.insight_factory = insight_factory
        # per-fold resources from the fold's training trajectories only (a fine-tuned encoder); None: ``res``
        self.fold_resources = fold_resources
        self.counter = TokenCounter()
        self.registry = dataset.registry
        self.all_tools = self.registry.to_openai()
        # [N]: a step sums the presented ones
        self.tool_tokens = [self.counter.tool(t) for t in self.all_tools]
        self.all_tools_tokens = sum(self.tool_tokens)
        self.fold_of = assign_folds([t.group for t in dataset.trajectories], cfg.folds, cfg.seed)
        self.tool_fold = tool_folds(dataset.trajectories, cfg.folds, cfg.seed) if cfg.holdout_tools else {}

    # ---- folds ---------------------------------------------------------------------------------
    def split(self, fold: int) -> tuple[list[Trajectory], list[Trajectory]]:
        train = [t for t in self.ds.trajectories if self.fold_of[t.group] != fold]
        test = [t for t in self.ds.trajectories if self.fold_of[t.group] == fold
                and (t.success or not self.cfg.test_successful_only)]
        if self.cfg.holdout_tools:
            train = without_tools(train, {tool for tool, f in self.tool_fold.items() if f == fold})
        if self.cfg.train_trajectories is not None:
            train = arrival_order(train, self.cfg.seed, fold)[:self.cfg.train_trajectories]
        return train, test

    def run(self) -> EvalResult:
        if self.cfg.regime not in ("teacher_forcing", "selection", "free_running"):
            raise ValueError(f"regime must be teacher_forcing, selection or free_running, "
                             f"got {self.cfg.regime!r}")
        if self.cfg.regime == "free_running" and self.environment is None:
            raise ValueError(f"dataset {self.ds.name!r} has no executable environment: "
                             "it runs teacher_forcing only")
        per_fold, records, tasks, fit_s, infos = [], [], [], [], []
        trie_based = False
        sampled = self.sample() if self.cfg.regime == "selection" else None
        tasks_run = self.sample_task_ids() if self.cfg.regime == "free_running" else None
        folds = range(self.cfg.folds)
        for fold in tqdm(folds, desc="folds", disable=not self.cfg.progress):
            train, test = self.split(fold)
            if self.fold_resources is not None:
                self.res = self.fold_resources(train)
            t0 = time.perf_counter()
            scorer = self.factory()
            scorer.fit(train, self.res)
            insight = self.insight_factory() if self.insight_factory else None
            if insight is not None:
                insight.fit(train, self.res)
            fit_s.append(time.perf_counter() - t0)
            if self.cfg.regime != "free_running":
                recs, fold_tasks = self.teacher_forcing(fold, scorer, insight, test, sampled), None
            else:
                recs, fold_tasks = self.free_running(fold, scorer, insight,
                                                     [t for t in test if t.id in tasks_run])
                tasks.extend(fold_tasks)
            # after the test steps: a memory's model calls include theirs
            infos.append(scorer.describe() | ({"insight": insight.describe()} if insight is not None else {}))
            called = {name for t in train for _, _, name, _ in iter_calls(t.messages)}
            for r in recs:  # what the fold's training trajectories never called is an unseen tool
                r.gold_seen = None if r.gold is None else r.gold in called
            trie_based = trie_based or any(r.in_trie is not None for r in recs)
            lat = self.latencies(scorer, insight, [s for t in test for s in extract_steps(t)], fold)
            per_fold.append(fold_metrics(recs, trie_based=trie_based,
                                         task_success=[t["success"] for t in fold_tasks]
                                         if fold_tasks is not None else None, latencies_ms=lat))
            records.extend(recs)
        mean, sd = aggregate(per_fold)
        return EvalResult(per_fold, mean, sd, records, tasks, recall_curve(records), len(records), trie_based,
                          fit_s, infos)

    def test_steps(self, test: Sequence[Trajectory]) -> list[Step]:
        """The teacher-forced steps of held-out trajectories: those whose gold tool is in the registry."""
        return [s for s in extract_all(test) if s.gold in self.registry]

    def sample(self) -> frozenset[tuple[str, int]]:
        """The ``selection`` regime's steps, as (trajectory id, step index): ``sample_steps`` of all folds'
        test steps, drawn with the run's seed (all of them when there are no more)."""
        keys = [(s.trajectory_id, s.index) for fold in range(self.cfg.folds)
                for s in self.test_steps(self.split(fold)[1])]
        n = self.cfg.sample_steps
        if n is None or n >= len(keys):
            return frozenset(keys)
        return frozenset(random.Random(self.cfg.seed).sample(keys, n))

    def sample_task_ids(self) -> frozenset[str]:
        """The ``free_running`` regime's tasks, as trajectory ids: ``sample_tasks`` of all folds' test
        trajectories, drawn with the run's seed (all of them when there are no more). Like :meth:`sample`,
        it depends only on the dataset, ``folds`` and ``seed``: every scorer and k runs the same tasks."""
        ids = [t.id for fold in range(self.cfg.folds) for t in self.split(fold)[1]]
        n = self.cfg.sample_tasks
        if n is None or n >= len(ids):
            return frozenset(ids)
        return frozenset(random.Random(self.cfg.seed).sample(ids, n))

    # ---- one batch of steps ----------------------------------------------------------------------
    def select(self, scorer: Scorer, insight, steps: Sequence[Step]):
        sel = finalize(scorer.score(steps), self.cfg.k, scorer.pad)
        guidance = list(sel.scores.guidance) if sel.scores.guidance else [None] * len(steps)
        if insight is not None:
            extra = insight.guidance(steps)
            guidance = ["\n\n".join(x for x in (g, e) if x) or None for g, e in zip(guidance, extra)]
        return sel, guidance

    def records_for(self, fold: int, steps: Sequence[Step], golds: Sequence[ToolCall | None], scorer: Scorer,
                    insight, withheld: Sequence[frozenset[str]] | None = None
                    ) -> tuple[list[StepRecord], list]:
        """Select, ask the executor and record each step; ``withheld[i]``: tool names step i may not
        present."""
        sel, guidance = self.select(scorer, insight, steps)
        presented_ids = [tuple(p) for p in sel.presented]
        for i, names_out in enumerate(withheld or ()):
            if names_out:
                ids_out = {self.registry.id(n) for n in names_out if n in self.registry}
                presented_ids[i] = without(presented_ids[i], sel.ranking[i].tolist(), ids_out)
        n = len(self.registry)
        gold_ids = torch.tensor([self.registry.id(g.name) if g and g.name in self.registry else n
                                 for g in golds])
        hit = sel.ranking == gold_ids[:, None]                                        # [B, N]
        gold_rank = torch.where(hit.any(1), hit.float().argmax(1) + 1, torch.zeros_like(gold_ids))  # [B]
        requests, msgs_all = [], []
        for i, step in enumerate(steps):
            tools = [self.all_tools[j] for j in presented_ids[i]]
            msgs = with_guidance(step.context, guidance[i])
            msgs_all.append(msgs)
            requests.append(Request(messages=msgs, tools=tools, gold=golds[i]))
        decisions = self.executor.choose(requests)
        names = self.registry.names
        sc = sel.scores
        in_trie, kappa = sc.diagnostics.get("in_trie"), sc.diagnostics.get("kappa")
        extra = {k: v for k, v in sc.diagnostics.items() if k not in RECORDED_DIAGNOSTICS}
        out = []
        for i, (step, gold, dec) in enumerate(zip(steps, golds, decisions)):
            # the guidance is in the system prompt
            local = (sum(self.counter.message(m) for m in msgs_all[i])
                     + sum(self.tool_tokens[j] for j in presented_ids[i]))
            full = sum(self.counter.message(m) for m in step.context) + self.all_tools_tokens
            rank_i = int(gold_rank[i]) or None
            presented = [names[j] for j in presented_ids[i]]
            outcome = step_outcome(dec, presented, gold.name if gold else None)
            out.append(StepRecord(
                fold=fold, trajectory_id=step.trajectory_id, group=step.group, step=step.index,
                turn=step.turn, position=step.position, gold=gold.name if gold else None, gold_rank=rank_i,
                ranking=[names[j] for j in sel.ranking[i, :10].tolist()],
                presented=presented,
                in_trie=None if in_trie is None else bool(in_trie[i]),
                fell_back=None if in_trie is None else bool(sc.fell_back[i]),
                kappa=None if kappa is None else round(float(kappa[i]), 6),
                selected=dec.call.name if dec.call else None,
                # the gold among the tools the model is shown (reserved slots included), not the ranking's
                hit_at_k=gold is not None and gold.name in presented,
                prompt_tokens=dec.prompt_tokens if dec.prompt_tokens is not None else local,
                prompt_tokens_local=local, full_registry_tokens=full,
                prompt_tokens_by="server" if dec.prompt_tokens is not None else "local",
                executor_seconds=dec.seconds,
                extra={k: round(float(v[i]), 6) for k, v in extra.items()}, **outcome,
            ))
        return out, decisions

    # ---- regimes -------------------------------------------------------------------------------
    def teacher_forcing(self, fold: int, scorer: Scorer, insight, test: Sequence[Trajectory],
                        sampled: frozenset[tuple[str, int]] | None = None) -> list[StepRecord]:
        """Every test step, or only those in ``sampled`` (the selection regime's)."""
        steps = self.test_steps(test)
        if sampled is not None:
            steps = [s for s in steps if (s.trajectory_id, s.index) in sampled]
        out = []
        bar = tqdm(total=len(steps), desc=f"fold {fold} steps", disable=not self.cfg.progress, leave=False)
        for lo in range(0, len(steps), self.cfg.batch_size):
            batch = steps[lo: lo + self.cfg.batch_size]
            golds = [ToolCall(s.gold, s.gold_arguments, f"gold-{s.trajectory_id}-{s.index}") for s in batch]
            recs, _ = self.records_for(fold, batch, golds, scorer, insight)
            out.extend(recs)
            bar.update(len(batch))
        bar.close()
        return out

    def free_running(self, fold: int, scorer: Scorer, insight, test: Sequence[Trajectory]):
        """All held-out tasks advance in lockstep, one step each per round, so scoring, embedding and
        the executor run batched across tasks; each task's conversation and backends are its own."""
        episodes = [self.environment.episode(traj) for traj in test]
        records = []
        bar = tqdm(desc=f"fold {fold} free-running steps", disable=not self.cfg.progress, leave=False)
        while True:
            ready = [e for e in episodes if e.ready(self.executor.is_oracle)]
            if not ready:
                break
            golds = [e.outstanding[0] if e.outstanding else None for e in ready]
            steps = [step_from_messages(e.messages, e.traj.id, e.traj.group, g.name if g else "", e.n_step)
                     for e, g in zip(ready, golds)]
            withheld = [e.withheld() for e in ready]
            for lo in range(0, len(ready), self.cfg.batch_size):
                hi = lo + self.cfg.batch_size
                recs, decs = self.records_for(fold, steps[lo:hi], golds[lo:hi], scorer, insight,
                                              withheld[lo:hi])
                records.extend(recs)
                for e, gold, dec in zip(ready[lo:hi], golds[lo:hi], decs):
                    e.apply(dec, gold, self.cfg.max_steps_per_turn)
            bar.update(len(ready))
        bar.close()
        return records, [e.verdict(fold) for e in episodes]

    # ---- latency -------------------------------------------------------------------------------
    def latencies(self, scorer: Scorer, insight, steps: Sequence[Step], fold: int) -> list[float]:
        """Selection latency per step, one step at a time, embedding included (cache bypassed, one thread)."""
        n = min(self.cfg.latency_sample, len(steps))
        if n == 0:
            return []
        sample = random.Random(self.cfg.seed * 1000 + fold).sample(list(steps), n)
        cached = self.res.embedder
        # measure the real encode, not a cache hit
        self.res.embedder = cached.inner if isinstance(cached, CachedEmbedder) else cached
        # one thread: a single short encode gains nothing from a second one, and on a shared machine a
        # second thread waiting for a busy core made the figure 10-20x noisier
        try:
            out = []
            with one_thread():
                for s in sample:
                    t0 = time.perf_counter()
                    self.select(scorer, insight, [s])
                    out.append((time.perf_counter() - t0) * 1000)
            return out
        finally:
            self.res.embedder = cached


def without(presented: Sequence[int], ranking: Sequence[int], withheld: set[int]) -> tuple[int, ...]:
    """``presented`` minus the ``withheld`` tool ids, each removed one replaced by the next ranked tool
    that is neither withheld nor presented (so the model still sees as many tools)."""
    if not withheld.intersection(presented):
        return tuple(presented)
    kept = [j for j in presented if j not in withheld]
    refill = (j for j in ranking if j not in withheld and j not in presented)
    return tuple(kept) + tuple(j for _, j in zip(range(len(presented) - len(kept)), refill))
