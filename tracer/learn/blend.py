"""The per-state blend head: w and T for every decision step, trained by inner-fold NLL.

At a step whose state S has children t (empirical prior P, contextual prior L, see
:mod:`tracer.memory.trie`) the head predicts a blend weight ``w in (0, 1)`` and a temperature ``T > 0``
from five state features and scores each child

    s(t) = (w P(t) + (1 - w) L(t)) / T.

Objective (same shape as DPR's ``BiEncoderNllLoss.calc``): ``log_softmax`` of ``s`` over the
node's children, ``nll_loss`` on the gold child, mean over the steps whose gold is a child;
returns ``(loss, number correct)``. Steps whose gold is not a child carry no gradient; they are
counted (``StepData.n_uncovered``) and reported.

State features (``FEATURES``, standardised with the training split's mean and SD, stored in the
head's buffers). Each says how far one of the two priors can be trusted at this state:

- ``log_visits`` = log(1 + N(S)): how much evidence the counts rest on. A node seen twice has a
  noisy P; a node seen a thousand times has a sharp, reliable P.
- ``depth`` = length of the state (turn-local prefix): deep prefixes are rarer and more
  task-specific, shallow ones (the turn opening) are where the user's request, i.e. the context,
  decides most.
- ``log_children`` = log(1 + number of children): how wide the choice is; with many children
  the counts spread thin and the context has more to separate.
- ``entropy_p`` = H(P) / log(#children) (0 with one child): normalised entropy of the empirical
  prior. A peaked P (one dominant continuation) deserves weight; a flat P says nothing.
- ``entropy_l`` = H(L) / log(#children): normalised entropy of the contextual prior. A peaked L
  means the context matches one edge memory much better than the others; a flat L means the
  context does not discriminate.

Heads: two linear maps over the standardised features, ``w = m + (1 - 2m) sigmoid(a.z + b)``
(``m = 1e-4`` keeps w strictly inside (0, 1) even when the sigmoid saturates) and
``T = t_floor + softplus(c.z + d)`` (T >= t_floor > 0, so 1/T is finite). Standardised features
are clipped to +-8 SD so that an out-of-range state cannot blow up either head. Weights start at
zero and the biases at w = 0.5, T = 0.5, i.e. exactly the fixed blend s = P + L of
``tracer_fixed``: training starts from the baseline and moves only where the data says so.

Training without leakage (:func:`inner_fold_data`): the training trajectories are split into
inner folds by group; for each inner fold the trie and edge memories are built from the other
folds only and the held-out fold's steps are scored against it, so every training step's features
and priors come from an index that never saw its own trajectory. θ is fitted with Adam plus an ℓ2
penalty on the head weights (not the biases), full-batch or mini-batch, early-stopped on a
held-out inner fold, seeded and deterministic on CPU (:func:`train_head`). By default the held-out
fold rotates: one head per inner fold, each stopped on its own fold, parameters averaged.

References: DPR (Karpukhin et al., 2020), ``BiEncoderNllLoss``; the TRACER paper's learned blend
(Tables 13 and 14: predicted w/T per environment and the w head's coefficients).

Example::

    head, history, data = fit_blend_head(trajectories, res, key=StateKey(), rendering=ContextRendering())
    cb = trie.gather(trie.lookup(steps), contexts)
    scores, _, _ = head(cb.log_p, cb.log_l, cb.mask, state_features(cb))
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tracer.core.context import ContextRendering
from tracer.core.folds import inner_seed, kfold, row_folds
from tracer.core.threads import one_thread
from tracer.core.types import Step, Trajectory
from tracer.learn.early_stopping import EarlyStopping
from tracer.memory.keys import StateKey
from tracer.memory.trie import ChildBatch, ExecutionTrie
from tracer.scoring.resources import Resources, training_steps

FEATURES = ("log_visits", "depth", "log_children", "entropy_p", "entropy_l")
IGNORE = -100          # gold index of a step whose gold is not a child (F.cross_entropy's ignore_index)
_MASKED = -1e9         # logit of a padded child inside the loss (finite: no NaN in all-padded rows)
_W_MARGIN = 1e-4       # w in [m, 1 - m]
_Z_CLIP = 8.0          # standardised features clipped to +- this many SD


# ---- features ------------------------------------------------------------------------------------
def _normalised_entropy(prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """H(prob) / log(#children) per row, ``[B, C] -> [B]``; 0 for rows with fewer than two children."""
    prob = torch.where(mask, prob, torch.zeros_like(prob))
    prob = prob / prob.sum(1, keepdim=True).clamp_min(1e-30)
    h = -torch.where(prob > 0, prob * torch.log(prob.clamp_min(1e-30)), torch.zeros_like(prob)).sum(1)
    n = mask.sum(1).to(prob.dtype)
    return torch.where(n > 1, h / torch.log(n.clamp_min(2)), torch.zeros_like(h))


def state_features(cb: ChildBatch) -> torch.Tensor:
    """The five state features (``FEATURES``) of a child batch, raw (not standardised): ``[B, 5]``."""
    dtype = cb.log_p.dtype if cb.log_p.is_floating_point() else torch.float32
    mask = cb.mask
    n_child = mask.sum(1).to(dtype)                                                      # [B]
    visits = torch.log1p(cb.node_count.to(dtype))                                        # [B]
    depth = cb.depth.clamp_min(0).to(dtype)                                              # [B]
    p = cb.count.to(dtype) / cb.node_count.clamp_min(1).to(dtype)[:, None]               # [B, C]
    q = torch.exp(torch.where(mask, cb.log_l, torch.zeros_like(cb.log_l)))               # [B, C]
    return torch.stack([visits, depth, torch.log1p(n_child), _normalised_entropy(p, mask),
                        _normalised_entropy(q, mask)], dim=1)                            # [B, 5]


# ---- the head ------------------------------------------------------------------------------------
class BlendHead(nn.Module):
    """Per-step blend weight w and temperature T from standardised state features.

    Args:
        n_features: input width (5, ``FEATURES``).
        t_floor: lower bound of T (T = t_floor + softplus(.)), so 1/T <= 1/t_floor.
        keep: ``[n_features]`` 1 for a feature in use, 0 for one dropped (ablation); a dropped
            feature is zeroed after standardisation.

    Inputs of :meth:`forward`: ``log_p, log_l [B, C]`` (-inf where masked), ``mask [B, C]``,
    ``feats [B, F]`` raw features, optional ``gold [B]`` child index (``IGNORE`` where the gold is
    not a child). Returns ``(scores [B, C] with -inf where masked, loss or None, n_correct or None)``.
    """

    def __init__(self, n_features: int = len(FEATURES), t_floor: float = 0.05, keep: torch.Tensor | None = None):
        super().__init__()
        if not t_floor > 0:
            raise ValueError(f"t_floor must be > 0, got {t_floor}")
        self.w_head = nn.Linear(n_features, 1)
        self.t_head = nn.Linear(n_features, 1)
        t0 = max(0.5 - t_floor, 0.05)  # start at T = 0.5 (the fixed blend) when the floor allows
        with torch.no_grad():
            self.w_head.weight.zero_()
            self.w_head.bias.zero_()
            self.t_head.weight.zero_()
            self.t_head.bias.fill_(math.log(math.expm1(t0)))  # softplus^-1(t0)
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.register_buffer("keep", torch.ones(n_features) if keep is None else keep.detach().clone().float())
        self.register_buffer("t_floor", torch.tensor(float(t_floor)))

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, torch.Tensor]) -> BlendHead:
        head = cls(int(sd["w_head.weight"].shape[1]), float(sd["t_floor"]))
        head.load_state_dict(dict(sd))
        return head

    def set_feature_stats(self, feats: torch.Tensor) -> BlendHead:
        """Standardise with the mean and SD of ``feats [S, F]`` (the training split's rows)."""
        with torch.no_grad():
            self.mean.copy_(feats.mean(0))
            sd = feats.std(0, unbiased=False) if len(feats) > 1 else torch.ones_like(self.std)
            self.std.copy_(torch.where(sd > 1e-6, sd, torch.ones_like(sd)))  # a constant feature stays 0
        return self

    def standardise(self, feats: torch.Tensor) -> torch.Tensor:
        z = (feats.to(self.mean.dtype) - self.mean) / self.std * self.keep                # [B, F]
        return z.clamp(-_Z_CLIP, _Z_CLIP)

    def wt(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w [B] in (0, 1), T [B] >= t_floor)`` for raw features ``[B, F]``."""
        z = self.standardise(feats)
        w = _W_MARGIN + (1 - 2 * _W_MARGIN) * torch.sigmoid(self.w_head(z).squeeze(-1))
        t = self.t_floor + F.softplus(self.t_head(z).squeeze(-1))
        return w, t

    @staticmethod
    def blend(log_p: torch.Tensor, log_l: torch.Tensor, mask: torch.Tensor, w: torch.Tensor,
              t: torch.Tensor) -> torch.Tensor:
        """s = (w P + (1 - w) L) / T per child, ``[B, C]``, 0 on the padding (mask it before use)."""
        # zero the padding before multiplying: w * -inf would put NaN into the gradient of w
        p = log_p.to(w.dtype).masked_fill(~mask, 0.0)                                    # [B, C]
        lc = log_l.to(w.dtype).masked_fill(~mask, 0.0)                                   # [B, C]
        return (w[:, None] * p + (1 - w[:, None]) * lc) / t[:, None]

    def forward(self, log_p: torch.Tensor, log_l: torch.Tensor, mask: torch.Tensor, feats: torch.Tensor,
                gold: torch.Tensor | None = None):
        w, t = self.wt(feats)                                                            # [B], [B]
        s = self.blend(log_p, log_l, mask, w, t)                                         # [B, C]
        scores = s.masked_fill(~mask, float("-inf"))
        if gold is None:
            return scores, None, None
        logits = s.masked_fill(~mask, _MASKED)                                           # padding masked, not looped
        gold = gold.to(s.device, torch.long)
        valid = gold != IGNORE                                                           # [B]
        if not bool(valid.any()):
            return scores, s.sum() * 0.0, torch.zeros((), dtype=torch.long, device=s.device)
        loss = F.nll_loss(F.log_softmax(logits, dim=1), gold, ignore_index=IGNORE, reduction="mean")
        n_correct = ((logits.argmax(1) == gold) & valid).sum()
        return scores, loss, n_correct

    def coefficients(self, names: Sequence[str] = FEATURES) -> dict[str, dict[str, float]]:
        """Fitted coefficients over standardised features (the paper's Table 14 for w), plus T's."""
        out = {}
        for head_name, lin in (("w", self.w_head), ("T", self.t_head)):
            coef = {n: float(c) for n, c in zip(names, lin.weight.detach().cpu()[0])}
            coef["bias"] = float(lin.bias.detach().cpu()[0])
            out[head_name] = coef
        return out

    def feature_stats(self, names: Sequence[str] = FEATURES) -> dict[str, Any]:
        return {"features": list(names), "mean": self.mean.cpu().tolist(), "std": self.std.cpu().tolist(),
                "keep": self.keep.cpu().tolist(), "t_floor": float(self.t_floor)}


def fixed_blend(log_p: torch.Tensor, log_l: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """tracer_fixed's scores s = P + L (w = 0.5, T = 0.5), ``[B, C]`` with -inf where masked."""
    return torch.where(mask, log_p + log_l, torch.full_like(log_p, float("-inf")))


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

        def pad(x, value):
            return F.pad(x, (0, width - x.shape[1]), value=value)

        return StepData(
            torch.cat([pad(p.log_p, float("-inf")) for p in parts]), torch.cat([pad(p.log_l, float("-inf")) for p in parts]),
            torch.cat([pad(p.mask, False) for p in parts]), torch.cat([p.feats for p in parts]),
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


def inner_fold_data(trajectories: Sequence[Trajectory], res: Resources, key: StateKey | None = None,
                    rendering: ContextRendering | None = None, eps: float = 1e-6, successful_only: bool = True,
                    inner_folds: int = 5, seed: int = 0, timings: dict | None = None) -> StepData:
    """Out-of-fold step data for one training split: each inner fold scored by a trie of the others.

    The split's trajectories are divided into ``inner_folds`` folds by group (:func:`tracer.core.folds.row_folds`,
    seeded); the trie and edge memories for fold f are built from the steps of every other fold,
    so no step's own count or context reaches the index it is scored against.
    """
    key, rendering = key or StateKey(), rendering or ContextRendering()
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
    parts = []
    for f, seen, held in row_folds([s.group for s in steps], inner_folds, seed):
        trie = ExecutionTrie.build([steps[i] for i in seen.tolist()], gold_ids[seen], ctx[seen.to(ctx.device)],
                                   len(res.registry), key, eps, res.device)
        held_steps = [steps[i] for i in held.tolist()]
        parts.append(score_steps(trie, held_steps, ctx[held.to(ctx.device)], gold_ids[held],
                                 [domain_of[s.trajectory_id] for s in held_steps], f))
    if timings is not None:
        timings["seconds_embed"] = timings.get("seconds_embed", 0.0) + (t1 - t0)
        timings["seconds_index"] = timings.get("seconds_index", 0.0) + (time.perf_counter() - t1)
    return StepData.cat(parts)


# ---- training ------------------------------------------------------------------------------------
def _keep_mask(drop: Sequence[str | int]) -> torch.Tensor:
    keep = torch.ones(len(FEATURES))
    for d in drop:
        j = FEATURES.index(d) if isinstance(d, str) else int(d)
        keep[j] = 0.0
    return keep


def train_head(data: StepData, t_floor: float = 0.05, lr: float = 0.05, weight_decay: float = 1e-3,
               max_epochs: int = 500, patience: int = 50, batch_size: int = 0, seed: int = 0,
               rotate: bool = True, val_fold: int | None = None,
               drop: Sequence[str | int] = ()) -> tuple[BlendHead, dict]:
    """Fit a :class:`BlendHead` on out-of-fold step data with early stopping on held-out inner folds.

    With ``rotate`` (default) one head is fitted per inner fold, each early-stopped on that fold
    and trained on the others, and the final head's parameters are their mean; without it one head
    is early-stopped on ``val_fold`` (default: the last inner fold). Every head standardises with
    the same statistics: mean and SD of the training split's steps in the trie.

    Why rotate: on BFCL a single early-stopping fold is noisy (inner folds differ by task), and
    Adam's first steps move every coefficient by about ``lr`` whatever its gradient's size, so a
    head stopped after a dozen epochs reports near-equal coefficients. Averaging the k heads uses
    every fold for stopping and gave lower outer-fold NLL (see the report in ``train.py``).

    Args:
        data: from :func:`inner_fold_data`.
        t_floor: lower bound of T.
        lr, weight_decay: Adam's learning rate; strength of the ℓ2 penalty on both heads' weights.
        max_epochs, patience: stop when the validation NLL has not improved for ``patience`` epochs;
            the best epoch's weights are kept.
        batch_size: 0 for full-batch, else mini-batches in a seeded order.
        seed: seeds the mini-batch order (weights start at zero: the fixed blend).
        rotate: average one head per held-out inner fold (True) or fit one head (False).
        val_fold: the early-stopping fold when not rotating.
        drop: features left out (names or indices), for the ablation.

    Returns ``(head, history)``; ``history["runs"]`` holds each head's loss curve.
    """
    with one_thread():
        t0 = time.perf_counter()
        rows = data.in_trie
        head = BlendHead(len(FEATURES), t_floor, _keep_mask(drop)).to(data.log_p.device)
        hist: dict[str, Any] = {"n_steps": len(data), "n_in_trie": int(rows.sum()), "n_uncovered": data.n_uncovered,
                                "n_train": int((rows & data.covered).sum()),
                                "dropped": [f for f, k in zip(FEATURES, head.keep.tolist()) if k == 0], "runs": []}
        if not bool((rows & data.covered).any()):  # nothing to learn from: the initial head, i.e. the fixed blend
            hist.update(best_val_loss=float("nan"), seconds_train=0.0,
                        note="no training step has its gold among the children")
            return head.eval(), hist
        head.set_feature_stats(data.feats[rows])
        folds = sorted(set(data.fold[rows].tolist()))
        if rotate and len(folds) > 1:
            vals = folds
        else:
            vals = [folds[-1] if val_fold is None else val_fold]
        states = []
        for v in vals:
            h = copy.deepcopy(head)
            run = _fit_one(h, data, v, lr, weight_decay, max_epochs, patience, batch_size, seed)
            states.append(h.state_dict())
            hist["runs"].append(run)
        head.load_state_dict({k: torch.stack([sd[k] for sd in states]).mean(0) for k in states[0]})
        n_val = [r["n_val"] for r in hist["runs"]]
        hist["best_val_loss"] = sum(r["best_val_loss"] * n for r, n in zip(hist["runs"], n_val)) / max(sum(n_val), 1)
        hist["best_epochs"] = [r["best_epoch"] for r in hist["runs"]]
        hist["seconds_train"] = time.perf_counter() - t0
        return head.eval(), hist


def _fit_one(head: BlendHead, data: StepData, val_fold: int, lr: float, weight_decay: float, max_epochs: int,
             patience: int, batch_size: int, seed: int) -> dict[str, Any]:
    """Adam + ℓ2 on the rows outside ``val_fold``, early-stopped on the rows inside it; in place."""
    device = data.log_p.device
    rows = data.in_trie
    val = rows & (data.fold == val_fold)
    train = rows & ~val
    if not bool((train & data.covered).any()) or not bool((val & data.covered).any()):
        train, val = rows, rows.clone()  # too little data to hold a fold out: stop on the training loss
    tr, va = data.subset(train), data.subset(val)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    stopper = EarlyStopping(head, patience)
    n_val = int(va.covered.sum())

    def penalty():
        return weight_decay * (head.w_head.weight.pow(2).sum() + head.t_head.weight.pow(2).sum())

    for epoch in range(max_epochs):
        head.train()
        order = torch.randperm(len(tr), generator=gen) if batch_size else torch.arange(len(tr))
        chunks = order.split(batch_size) if batch_size else [order]
        ep_loss = 0.0
        for idx in chunks:
            idx = idx.to(device)
            _, loss, _ = head(tr.log_p[idx], tr.log_l[idx], tr.mask[idx], tr.feats[idx], tr.gold[idx])
            opt.zero_grad()
            (loss + penalty()).backward()
            opt.step()
            ep_loss += float(loss.detach()) * len(idx)
        head.eval()
        with torch.no_grad():
            _, vloss, vcorrect = head(va.log_p, va.log_l, va.mask, va.feats, va.gold)
        if stopper.step(epoch, ep_loss / max(len(tr), 1), float(vloss), int(vcorrect) / max(n_val, 1)):
            break
    stopper.restore()
    return {"val_fold": val_fold, **stopper.curves, "best_epoch": stopper.best_epoch, "best_val_loss": stopper.best,
            "epochs": stopper.epochs, "n_train": int(tr.covered.sum()), "n_val": n_val}


def fit_blend_head(trajectories: Sequence[Trajectory], res: Resources, key: StateKey | None = None,
                   rendering: ContextRendering | None = None, eps: float = 1e-6, successful_only: bool = True,
                   inner_folds: int = 5, t_floor: float = 0.05, lr: float = 0.05, weight_decay: float = 1e-3,
                   max_epochs: int = 500, patience: int = 50, batch_size: int = 0, rotate: bool = True,
                   seed: int | None = None, drop: Sequence[str | int] = ()) -> tuple[BlendHead, dict, StepData]:
    """Build the inner-fold data of one training split and fit the head on it (``TracerScorer.fit``).

    ``seed`` (default ``res.seed``) seeds the inner folds through :func:`tracer.core.folds.inner_seed`.
    Returns ``(head on res.device, history, data)``: the history has the loss curves and the seconds
    spent embedding, building inner indexes and training; ``data`` is the out-of-fold
    :class:`StepData` the head was fitted on (``train.py`` reports w and T over it).
    """
    seed = res.seed if seed is None else seed
    timings: dict[str, float] = {}
    data = inner_fold_data(trajectories, res, key, rendering, eps, successful_only, inner_folds,
                           inner_seed(seed, 0), timings)
    head, hist = train_head(data, t_floor, lr, weight_decay, max_epochs, patience, batch_size, seed, rotate,
                            drop=drop)
    hist.update(timings)
    hist["seconds_fit"] = hist["seconds_index"] + hist["seconds_train"]
    return head.to(res.device), hist, data


# ---- evaluation and reports ----------------------------------------------------------------------
@torch.no_grad()
def evaluate(head: BlendHead | None, data: StepData) -> dict[str, float]:
    """Held-out NLL (mean over steps whose gold is a child) and recall@1 among the children
    (over steps whose state is in the trie; a gold that is not a child counts as a miss).
    ``head=None`` evaluates the fixed blend s = P + L."""
    rows = data.in_trie
    d = data.subset(rows)
    if head is None:
        s = fixed_blend(d.log_p, d.log_l, d.mask)
    else:
        s, _, _ = head(d.log_p, d.log_l, d.mask, d.feats)
    logp = torch.log_softmax(s.masked_fill(~d.mask, _MASKED), dim=1)                      # [S, C]
    cov = d.covered
    nll = -logp[cov].gather(1, d.gold[cov][:, None]).squeeze(1)
    hit = (s.argmax(1) == d.gold) & cov
    return {"nll_sum": float(nll.sum()), "n_covered": int(cov.sum()), "hits": int(hit.sum()), "n_in_trie": len(d),
            "nll": float(nll.mean()) if len(nll) else float("nan"),
            "recall_at_1": int(hit.sum()) / len(d) if len(d) else float("nan")}


def heldout_ablation(trajectories: Sequence[Trajectory], res: Resources, key: StateKey | None = None,
                     rendering: ContextRendering | None = None, eps: float = 1e-6,
                     successful_only: bool = True, head: Mapping | None = None, folds: int = 5,
                     seed: int = 0) -> dict[str, dict[str, float]]:
    """Outer k-fold comparison: fixed blend, the full head, the head with each feature dropped, and
    the head with every feature dropped (``bias_only``: one w and T for all states).

    For every outer fold the head is fitted on the training split's inner-fold data (exactly as
    ``TracerScorer.fit``) and evaluated on the test split's steps against the training split's
    full trie. Returns per variant the pooled held-out NLL and recall@1 (see :func:`evaluate`).
    """
    key, rendering = key or StateKey(), rendering or ContextRendering()
    cfg = {k: v for k, v in dict(head or {}).items() if k not in ("seed", "fold", "drop")}
    inner = cfg.pop("inner_folds", 5)
    variants: dict[str, Sequence[str] | None] = {"fixed": None, "learned": ()}
    variants.update({f"-{f}": (f,) for f in FEATURES})
    variants["bias_only"] = FEATURES  # one global w and T: do the state features matter at all?
    tot = {v: {"nll_sum": 0.0, "n_covered": 0, "hits": 0, "n_in_trie": 0} for v in variants}
    for split in kfold(trajectories, folds, seed):
        data = inner_fold_data(split.train, res, key, rendering, eps, successful_only, inner,
                               inner_seed(seed, split.fold))
        train_steps = training_steps(split.train, res.registry, successful_only)
        trie = ExecutionTrie.build(train_steps, res.tool_ids([s.gold for s in train_steps]),
                                   res.embed(train_steps, rendering), len(res.registry), key, eps, res.device)
        test_steps = training_steps(split.test, res.registry, True)
        domain_of = {t.id: t.domain for t in split.test}
        test = score_steps(trie, test_steps, res.embed(test_steps, rendering), res.tool_ids([s.gold for s in test_steps]),
                           [domain_of[s.trajectory_id] for s in test_steps])
        for name, drop in variants.items():
            h = None if drop is None else train_head(data, seed=seed, drop=drop, **cfg)[0]
            m = evaluate(h, test)
            for k in tot[name]:
                tot[name][k] += m[k]
    return {v: {**t, "nll": t["nll_sum"] / max(t["n_covered"], 1),
                "recall_at_1": t["hits"] / max(t["n_in_trie"], 1)} for v, t in tot.items()}


@torch.no_grad()
def wt_summary(head: BlendHead, data: StepData) -> dict[str, Any]:
    """Mean and SD of the predicted w and T over the steps in the trie, overall and per domain
    (the paper's Table 13)."""
    d = data.subset(data.in_trie)
    w, t = head.wt(d.feats)
    w, t = w.cpu().double(), t.cpu().double()

    def stats(idx):
        ww, tt = w[idx], t[idx]
        return {"n": len(ww), "w_mean": float(ww.mean()), "w_sd": float(ww.std(unbiased=False)),
                "T_mean": float(tt.mean()), "T_sd": float(tt.std(unbiased=False))}

    by = {}
    for dom in sorted(set(d.domains)):
        by[dom] = stats(torch.tensor([x == dom for x in d.domains]))
    return {"all": stats(torch.ones(len(d), dtype=torch.bool)) if len(d) else {}, "by_domain": by,
            "w": w.tolist(), "T": t.tolist(), "domains": d.domains}


def build_report(dataset: str, head: BlendHead, history: Mapping, data: StepData,
                 ablation: Mapping | None = None) -> dict[str, Any]:
    """Everything ``train.py`` reports, as one JSON-able dict."""
    wt = wt_summary(head, data)
    corr = torch.corrcoef(data.feats.double().T) if len(data) > 1 else torch.eye(len(FEATURES))  # [F, F] Pearson
    return {"dataset": dataset, "features": list(FEATURES), "wt": {"all": wt["all"], "by_domain": wt["by_domain"]},
            "coefficients": head.coefficients(), "feature_stats": head.feature_stats(),
            "feature_correlation": {f: dict(zip(FEATURES, [round(float(x), 4) for x in row]))
                                    for f, row in zip(FEATURES, corr)},
            "fit": {**{k: v for k, v in history.items() if k != "runs"},
                    "runs": [{k: v for k, v in r.items() if not isinstance(v, list)} for r in history.get("runs", [])]},
            "ablation": ablation}


def report_markdown(report: Mapping[str, Any]) -> str:
    """A human-readable version of :func:`build_report`'s dict."""
    fit, a, nan = report["fit"], report["wt"]["all"], float("nan")
    lines = [f"# Blend head on {report['dataset']}", "",
             (f"Fitted on {fit.get('n_train')} out-of-fold steps whose gold is a child ({fit.get('n_uncovered')} "
              f"steps whose gold is not a child carry no gradient): {len(fit.get('runs', []))} head(s), each "
              f"early-stopped on one held-out inner fold (best epochs {fit.get('best_epochs')}), parameters "
              f"averaged; held-out inner-fold NLL {fit.get('best_val_loss', nan):.4f}."),
             (f"Fit time beyond embeddings: {fit.get('seconds_fit', nan):.2f} s (inner indexes "
              f"{fit.get('seconds_index', nan):.2f} s, training {fit.get('seconds_train', nan):.2f} s); "
              f"embedding {fit.get('seconds_embed', nan):.2f} s."), "",
             "## Predicted w and T (out-of-fold steps in the trie; Table 13)", "",
             "| environment | steps | w mean | w SD | T mean | T SD |", "|---|---:|---:|---:|---:|---:|",
             (f"| **all** | {a.get('n', 0)} | {a.get('w_mean', nan):.3f} | {a.get('w_sd', nan):.3f} | "
              f"{a.get('T_mean', nan):.3f} | {a.get('T_sd', nan):.3f} |")]
    for dom, s in report["wt"]["by_domain"].items():
        lines.append(f"| {dom} | {s['n']} | {s['w_mean']:.3f} | {s['w_sd']:.3f} | {s['T_mean']:.3f} | {s['T_sd']:.3f} |")
    lines += ["", "## Coefficients over standardised features (w head: Table 14)", "",
              "| head | " + " | ".join(report["features"]) + " | bias |", "|---|" + "---:|" * (len(report["features"]) + 1)]
    for h, c in report["coefficients"].items():
        lines.append(f"| {h} | " + " | ".join(f"{c[f]:+.3f}" for f in report["features"]) + f" | {c['bias']:+.3f} |")
    if report.get("feature_correlation"):
        fs = report["features"]
        lines += ["", "## Feature correlations (Pearson, out-of-fold steps; read coefficients with care)", "",
                  "| | " + " | ".join(fs) + " |", "|---|" + "---:|" * len(fs)]
        lines += [f"| {f} | " + " | ".join(f"{report['feature_correlation'][f][g]:+.2f}" for g in fs) + " |" for f in fs]
    if report.get("ablation"):
        lines += ["", "## Held-out comparison and feature ablation (outer folds)", "",
                  "| variant | NLL | recall@1 | steps in trie |", "|---|---:|---:|---:|"]
        for v, m in report["ablation"].items():
            lines.append(f"| {v} | {m['nll']:.4f} | {m['recall_at_1']:.4f} | {m['n_in_trie']} |")
    return "\n".join(lines) + "\n"


def plot_wt(w: Sequence[float], t: Sequence[float], path: str | Path) -> Path:
    """Histograms of the predicted w and T, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(8, 3))
    ax[0].hist(w, bins=40, range=(0, 1))
    ax[0].set_xlabel("w (weight of the empirical prior)")
    ax[1].hist(t, bins=40)
    ax[1].set_xlabel("T (temperature)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
