"""Fitting the blend head (:mod:`tracer.learn.blend_head`) on one training split, without leakage.

Out-of-fold data (:func:`inner_fold_data`, through :func:`tracer.learn.oof.out_of_fold`): the
training trajectories are split into inner folds by group; for each inner fold the trie and edge
memories are built from the other folds only and the held-out fold's steps are scored against it,
so every training step's features and priors come from an index that never saw its own trajectory.

Training (:func:`train_head`, through :func:`tracer.learn.trainer.train`): Adam plus an l2 penalty on
the head weights (not the biases), full-batch or mini-batch, early-stopped on a held-out inner fold,
seeded and deterministic on CPU. By default the held-out fold rotates: one head per inner fold, each
stopped on its own fold, parameters averaged.

Example::

    cfg = HeadConfig.from_config(scorer_cfg["head"])      # configs/scorer/tracer.yaml's head:
    head, history, data = fit_blend_head(trajectories, res, StateKey(), ContextRendering(), 1e-6, True, cfg)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

import torch

from tracer.core.context import ContextRendering
from tracer.core.folds import inner_seed
from tracer.core.threads import one_thread
from tracer.core.types import Step, Trajectory
from tracer.learn.blend_head import FEATURES, BlendHead, state_features
from tracer.learn.nll import IGNORE
from tracer.learn.oof import out_of_fold, pad_cat
from tracer.learn.standardise import keep_mask
from tracer.learn.trainer import TrainConfig, train
from tracer.memory.keys import StateKey
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.resources import Resources, training_steps


@dataclass(frozen=True)
class HeadConfig:
    """The blend head's training settings: ``configs/scorer/tracer.yaml``'s ``head:``, values from the caller.

    inner_folds: folds by group inside the training split. t_floor: lower bound of T.
    lr, weight_decay, max_epochs, patience, batch_size: see :class:`tracer.learn.trainer.TrainConfig`.
    rotate: one head per held-out inner fold, parameters averaged (False: stop on ``val_fold``,
    default the last inner fold). seed: seeds the inner folds and the mini-batch order (None: the
    resources' seed). drop: features left out (names or indices), for the ablation.
    """

    inner_folds: int
    t_floor: float
    lr: float
    weight_decay: float
    max_epochs: int
    patience: int
    rotate: bool
    batch_size: int
    seed: int | None = None
    drop: tuple[str | int, ...] = ()
    val_fold: int | None = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | HeadConfig, **given: Any) -> HeadConfig:
        """From a ``head:`` mapping (Hydra's ``_``-keys skipped; an unknown or missing key is an error
        naming it) or a config, ``given`` taking precedence."""
        if isinstance(cfg, HeadConfig):
            return replace(cfg, **given)
        values = {k: v for k, v in {**dict(cfg), **given}.items() if not str(k).startswith("_")}
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        missing = [f.name for f in fields(cls) if f.name not in values and f.default is MISSING]
        if unknown or missing:
            raise ValueError(f"blend head config: unknown keys {unknown}, missing keys {missing}; "
                             f"expected {[f.name for f in fields(cls)]}")
        values["drop"] = tuple(values.get("drop") or ())
        return cls(**values)

    def train_config(self) -> TrainConfig:
        if self.seed is None:
            raise ValueError("the blend head's training needs a seed (HeadConfig.seed)")
        return TrainConfig(self.lr, self.weight_decay, self.max_epochs, self.patience, self.batch_size,
                           self.seed)


# ---- step data -----------------------------------------------------------------------------------
@dataclass
class StepData:
    """Steps scored against an index: priors, features and gold child index, padded to width C.

    ``fold`` is the inner fold a step was held out in (-1 for test steps).
    """

    log_p: torch.Tensor   # [S, C]
    log_l: torch.Tensor   # [S, C]
    mask: torch.Tensor    # [S, C]
    feats: torch.Tensor   # [S, F]
    gold: torch.Tensor    # [S] child index, IGNORE where the gold is not a child
    fold: torch.Tensor    # [S]
    steps: list[Step]
    domains: list[str]

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def in_trie(self) -> torch.Tensor:  # [S] the state has children
        return self.mask.any(1)

    @property
    def covered(self) -> torch.Tensor:  # [S] the gold is a child
        return self.gold != IGNORE

    @property
    def n_uncovered(self) -> int:
        """Steps whose gold is not a child of their state (no gradient; counted)."""
        return int((~self.covered).sum())

    def subset(self, idx: torch.Tensor) -> StepData:
        idx = idx.nonzero().squeeze(1) if idx.dtype == torch.bool else idx
        il = idx.tolist()
        return StepData(self.log_p[idx], self.log_l[idx], self.mask[idx], self.feats[idx], self.gold[idx],
                        self.fold[idx], [self.steps[i] for i in il], [self.domains[i] for i in il])

    @staticmethod
    def cat(parts: Sequence[StepData]) -> StepData:
        width = max(max(p.mask.shape[1] for p in parts), 1)
        return StepData(
            pad_cat([p.log_p for p in parts], width, float("-inf")),
            pad_cat([p.log_l for p in parts], width, float("-inf")),
            pad_cat([p.mask for p in parts], width, False), torch.cat([p.feats for p in parts]),
            torch.cat([p.gold for p in parts]), torch.cat([p.fold for p in parts]),
            [s for p in parts for s in p.steps], [d for p in parts for d in p.domains])


def score_steps(trie: ExecutionTrie, steps: Sequence[Step], ctx: torch.Tensor, gold_ids: torch.Tensor,
                domains: Sequence[str], fold: int = -1) -> StepData:
    """Gather the children of ``steps`` (contexts ``ctx [S, d]``, gold registry ids ``[S]``) from ``trie``."""
    cb = trie.gather(trie.lookup(steps), ctx)
    hit = cb.mask & (cb.tool == gold_ids.to(cb.tool.device)[:, None])                     # [S, C]
    gold = torch.where(hit.any(1), hit.float().argmax(1), torch.full_like(cb.node, IGNORE))
    return StepData(cb.log_p, cb.log_l, cb.mask, state_features(cb), gold,
                    torch.full_like(cb.node, fold), list(steps), list(domains))


def inner_fold_data(trajectories: Sequence[Trajectory], res: Resources, key: StateKey,
                    rendering: ContextRendering, eps: float, successful_only: bool, inner_folds: int,
                    seed: int, timings: dict | None = None) -> StepData:
    """Out-of-fold step data for one training split: each inner fold scored by a trie of the others.

    The split's trajectories are divided into ``inner_folds`` folds by group (seeded); the trie and
    edge memories for fold f are built from the steps of every other fold, so no step's own count or
    context reaches the index it is scored against.
    """
    t0 = time.perf_counter()
    steps = training_steps(trajectories, res.registry, successful_only)
    groups = sorted({s.group for s in steps})
    if len(groups) < 2:
        raise ValueError(f"the blend head needs training steps from at least 2 groups for inner folds, got "
                         f"{len(groups)}; use tracer_fixed on data this small")
    domain_of = {t.id: t.domain for t in trajectories}
    ctx = res.embed(steps, rendering)                                                    # [S, d]
    t1 = time.perf_counter()
    gold_ids = res.tool_ids([s.gold for s in steps])                                     # [S]

    def build(seen: torch.Tensor, _fold: int) -> ExecutionTrie:
        return ExecutionTrie.build([steps[i] for i in seen.tolist()], gold_ids[seen],
                                   ctx[seen.to(ctx.device)], len(res.registry), key, eps, res.device)

    def score(trie: ExecutionTrie, held: torch.Tensor, f: int) -> StepData:
        held_steps = [steps[i] for i in held.tolist()]
        return score_steps(trie, held_steps, ctx[held.to(ctx.device)], gold_ids[held],
                           [domain_of[s.trajectory_id] for s in held_steps], f)

    parts = out_of_fold([s.group for s in steps], inner_folds, seed, build, score)
    if timings is not None:
        timings["seconds_embed"] = timings.get("seconds_embed", 0.0) + (t1 - t0)
        timings["seconds_index"] = timings.get("seconds_index", 0.0) + (time.perf_counter() - t1)
    return StepData.cat(parts)


# ---- training ------------------------------------------------------------------------------------
def train_head(data: StepData, cfg: HeadConfig) -> tuple[BlendHead, dict]:
    """Fit a :class:`BlendHead` on out-of-fold step data with early stopping on held-out inner folds.

    With ``cfg.rotate`` one head is fitted per inner fold, each early-stopped on that fold and
    trained on the others, and the final head's parameters are their mean; without it one head is
    early-stopped on ``cfg.val_fold`` (default: the last inner fold). Every head standardises with
    the same statistics: mean and SD of the training split's steps in the trie. ``cfg.seed`` seeds
    the mini-batch order (weights start at zero: the fixed blend).

    Why rotate: on BFCL a single early-stopping fold is noisy (inner folds differ by task), and
    Adam's first steps move every coefficient by about ``lr`` whatever its gradient's size, so a
    head stopped after a dozen epochs reports near-equal coefficients. Averaging the k heads uses
    every fold for stopping and gave lower outer-fold NLL (see the report of ``train.py``).

    Returns ``(head, history)``; ``history["runs"]`` holds each head's loss curve.
    """
    with one_thread():
        t0 = time.perf_counter()
        rows = data.in_trie
        head = BlendHead(len(FEATURES), cfg.t_floor, keep_mask(FEATURES, cfg.drop)).to(data.log_p.device)
        hist: dict[str, Any] = {"n_steps": len(data), "n_in_trie": int(rows.sum()),
                                "n_uncovered": data.n_uncovered, "n_train": int((rows & data.covered).sum()),
                                "dropped": [f for f, k in zip(FEATURES, head.keep.tolist()) if k == 0],
                                "runs": []}
        # nothing to learn from: the initial head, i.e. the fixed blend
        if not bool((rows & data.covered).any()):
            hist.update(best_val_loss=float("nan"), seconds_train=0.0,
                        note="no training step has its gold among the children")
            return head.eval(), hist
        head.set_feature_stats(data.feats[rows])
        folds = sorted(set(data.fold[rows].tolist()))
        if cfg.rotate and len(folds) > 1:
            vals = folds
        else:
            vals = [folds[-1] if cfg.val_fold is None else cfg.val_fold]
        states = []
        for v in vals:
            h = copy.deepcopy(head)
            run = _fit_one(h, data, v, cfg.train_config())
            states.append(h.state_dict())
            hist["runs"].append(run)
        head.load_state_dict({k: torch.stack([sd[k] for sd in states]).mean(0) for k in states[0]})
        n_val = [r["n_val"] for r in hist["runs"]]
        hist["best_val_loss"] = (sum(r["best_val_loss"] * n for r, n in zip(hist["runs"], n_val))
                                 / max(sum(n_val), 1))
        hist["best_epochs"] = [r["best_epoch"] for r in hist["runs"]]
        hist["seconds_train"] = time.perf_counter() - t0
        return head.eval(), hist


def _fit_one(head: BlendHead, data: StepData, val_fold: int, cfg: TrainConfig) -> dict[str, Any]:
    """Train on the rows outside ``val_fold``, early-stopped on the rows inside it; in place."""
    rows = data.in_trie
    val = rows & (data.fold == val_fold)
    train_rows = rows & ~val
    if not bool((train_rows & data.covered).any()) or not bool((val & data.covered).any()):
        train_rows, val = rows, rows.clone()  # too little data to hold a fold out: stop on the training loss
    tr, va = data.subset(train_rows), data.subset(val)
    n_val = int(va.covered.sum())

    def batch_loss(idx: torch.Tensor | None) -> torch.Tensor:
        if idx is None:
            return head(tr.log_p, tr.log_l, tr.mask, tr.feats, tr.gold)[1]
        return head(tr.log_p[idx], tr.log_l[idx], tr.mask[idx], tr.feats[idx], tr.gold[idx])[1]

    def val_loss() -> tuple[torch.Tensor, torch.Tensor]:
        _, loss, n_correct = head(va.log_p, va.log_l, va.mask, va.feats, va.gold)
        return loss, n_correct

    run = train(head, batch_loss, val_loss, len(tr), n_val, cfg, data.log_p.device)
    return {"val_fold": val_fold, **{k: run[k] for k in ("train_loss", "val_loss", "val_acc")},
            "best_epoch": run["best_epoch"], "best_val_loss": run["best_val_loss"], "epochs": run["epochs"],
            "n_train": int(tr.covered.sum()), "n_val": n_val}


def fit_blend_head(trajectories: Sequence[Trajectory], res: Resources, key: StateKey,
                   rendering: ContextRendering, eps: float, successful_only: bool,
                   cfg: HeadConfig) -> tuple[BlendHead, dict, StepData]:
    """Build the inner-fold data of one training split and fit the head on it (``TracerScorer.fit``).

    ``cfg.seed`` (None: ``res.seed``) seeds the inner folds through :func:`tracer.core.folds.inner_seed`.
    Returns ``(head on res.device, history, data)``: the history has the loss curves and the seconds
    spent embedding, building inner indexes and training; ``data`` is the out-of-fold
    :class:`StepData` the head was fitted on (the train job reports w and T over it).
    """
    seed = res.seed if cfg.seed is None else cfg.seed
    timings: dict[str, float] = {}
    data = inner_fold_data(trajectories, res, key, rendering, eps, successful_only, cfg.inner_folds,
                           inner_seed(seed, 0), timings)
    head, hist = train_head(data, replace(cfg, seed=seed))
    hist.update(timings)
    hist["seconds_fit"] = hist["seconds_index"] + hist["seconds_train"]
    return head.to(res.device), hist, data
