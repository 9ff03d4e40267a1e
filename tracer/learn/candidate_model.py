"""tracer_plus's candidate model and its training: a linear (or one-hidden-layer) scorer over the
candidate features of :mod:`tracer.learn.candidate_features`, trained by softmax NLL over each step's candidate set on
inner folds by group (no step scored by an index that saw its own trajectory), Adam with l2 and early
stopping. Moved out of :mod:`tracer.scorers.tracer_plus` unchanged; the scorer composes it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tracer.core.folds import row_folds
from tracer.core.io import atomic_save
from tracer.core.threads import one_thread
from tracer.core.types import Step
from tracer.learn.candidate_features import PlusIndex, candidates, feature_names
from tracer.learn.early_stopping import EarlyStopping
from tracer.memory.trie import ExecutionTrie

IGNORE = -100            # gold index of a step whose gold is not a candidate
_MASKED = -1e9           # logit of a padded candidate inside the loss
_Z_CLIP = 8.0            # standardised features clipped to +- this many SD


# ---- the model -----------------------------------------------------------------------------------
class CandidateModel(nn.Module):
    """Scores candidates from their standardised features.

    Args:
        n_features: F.
        kind: ``linear`` (``s = w . z``, weights start at 0: every candidate equal) or ``mlp``
            (``s = w2 . relu(W1 z + b1)``, ``hidden`` units, seeded init).
        hidden: MLP width.
        keep: ``[F]`` 1 for a feature in use, 0 for a dropped one (zeroed after standardising).
        seed: seeds the MLP's initial weights.

    ``forward(z [P, F] standardised rows of the real candidates) -> [P]`` scores.
    """

    def __init__(self, n_features: int, kind: str = "linear", hidden: int = 32, keep: torch.Tensor | None = None,
                 seed: int = 0):
        super().__init__()
        if kind not in ("linear", "mlp"):
            raise ValueError(f"model must be linear or mlp, got {kind!r}")
        self.kind, self.hidden = kind, hidden
        gen = torch.Generator().manual_seed(seed)
        if kind == "linear":
            self.net = nn.Linear(n_features, 1, bias=False)
            nn.init.zeros_(self.net.weight)
        else:
            self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, 1, bias=False))
            for lin in (self.net[0], self.net[2]):
                nn.init.kaiming_uniform_(lin.weight, a=5 ** 0.5, generator=gen)
            nn.init.zeros_(self.net[0].bias)
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.register_buffer("keep", torch.ones(n_features) if keep is None else keep.detach().clone().float())

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, torch.Tensor], kind: str, hidden: int) -> CandidateModel:
        model = cls(int(sd["mean"].shape[0]), kind, hidden)
        model.load_state_dict(dict(sd))
        return model

    def set_feature_stats(self, rows: torch.Tensor) -> CandidateModel:
        """Standardise with the mean and SD of the candidate rows ``[P, F]`` of the training split."""
        with torch.no_grad():
            rows = rows.double()
            self.mean.copy_(rows.mean(0).float() if len(rows) else torch.zeros_like(self.mean))
            sd = rows.std(0, unbiased=False).float() if len(rows) > 1 else torch.ones_like(self.std)
            self.std.copy_(torch.where(sd > 1e-6, sd, torch.ones_like(sd)))  # a constant feature stays 0
        return self

    def standardise(self, feats: torch.Tensor) -> torch.Tensor:
        """Raw features ``[..., F]`` -> standardised, dropped features zeroed, clipped (dtype of ``feats``)."""
        mean, std, keep = (b.to(feats.dtype) for b in (self.mean, self.std, self.keep))
        return ((feats - mean) / std * keep).clamp(-_Z_CLIP, _Z_CLIP)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).squeeze(-1)

    def penalty(self) -> torch.Tensor:
        """Sum of squared weights (biases excluded), for the l2 term."""
        return sum(p.pow(2).sum() for n, p in self.named_parameters() if n.endswith("weight"))

    # inference in float64 (both paths), rounded to float32 -----------------------------------
    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        self.__dict__.pop("_inf", None)  # drop the float64 copies of the old weights
        return super().load_state_dict(state_dict, strict, assign)

    def _inference(self) -> dict:
        """Float64 copies of the buffers and weights (torch and numpy), made once per set of weights."""
        inf = self.__dict__.get("_inf")
        if inf is None:
            net64 = copy.deepcopy(self.net).double().eval()
            inf = {"net": net64, "mean": self.mean.double(), "std": self.std.double(), "keep": self.keep.double(),
                   "np": [p.detach().cpu().numpy() for p in net64.parameters()]}
            inf.update({f"{b}_np": inf[b].cpu().numpy() for b in ("mean", "std", "keep")})
            self.__dict__["_inf"] = inf
        return inf

    @torch.no_grad()
    def scores(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, C]`` float32 (-inf where masked) from raw features ``[B, C, F]``, computed in float64."""
        inf = self._inference()
        mean, std, keep = (inf[b].to(feats.device) for b in ("mean", "std", "keep"))
        z = ((feats.double() - mean) / std * keep).clamp(-_Z_CLIP, _Z_CLIP)             # [B, C, F]
        s = inf["net"].to(feats.device)(z).squeeze(-1).float()                          # [B, C]
        return s.masked_fill(~mask, float("-inf"))

    def scores_one(self, feats: np.ndarray) -> np.ndarray:
        """:meth:`scores` for one step's candidates ``[C, F]`` (numpy, float64 inside) -> ``[C]`` float32."""
        inf = self._inference()
        z = np.clip((feats.astype(np.float64) - inf["mean_np"]) / inf["std_np"] * inf["keep_np"], -_Z_CLIP, _Z_CLIP)
        p = inf["np"]
        if self.kind == "linear":                                                        # p: [weight [1, F]]
            return (z @ p[0][0]).astype(np.float32)
        h = np.maximum(z @ p[0].T + p[1], 0.0)                                           # [C, H]
        return (h @ p[2][0]).astype(np.float32)


def save_candidate_model(model: CandidateModel, names: Sequence[str], path: str | Path) -> Path:
    """Write a candidate model with its feature names (for ``transfer``), atomically."""
    return atomic_save({"features": list(names), "kind": model.kind, "hidden": model.hidden,
                        "state_dict": model.state_dict()}, path)


def load_candidate_model(path: str | Path, names: Sequence[str], kind: str) -> CandidateModel:
    """Read :func:`save_candidate_model`'s file; other feature names (keys, feature set) or another
    model kind are refused."""
    obj = torch.load(path, weights_only=True)
    if list(obj["features"]) != list(names) or obj["kind"] != kind:
        raise ValueError(f"{path}: a {obj['kind']} model on features {obj['features']}; this scorer is {kind} on "
                         f"{list(names)}")
    return CandidateModel.from_state_dict(obj["state_dict"], obj["kind"], int(obj["hidden"])).eval()


# ---- training data -------------------------------------------------------------------------------
@dataclass
class CandidateData:
    """Out-of-fold candidates of the training steps: raw features, gold position, inner fold."""

    feats: torch.Tensor   # [S, C, F]
    mask: torch.Tensor    # [S, C]
    gold: torch.Tensor    # [S] candidate index, IGNORE where the gold is not a candidate
    fold: torch.Tensor    # [S] inner fold the step was held out in

    def __len__(self) -> int:
        return len(self.gold)

    @property
    def covered(self) -> torch.Tensor:  # [S]
        return self.gold != IGNORE

    @property
    def n_uncovered(self) -> int:
        return int((~self.covered).sum())

    @staticmethod
    def cat(parts: Sequence[CandidateData]) -> CandidateData:
        width = max([p.mask.shape[1] for p in parts] + [1])
        return CandidateData(
            torch.cat([F.pad(p.feats, (0, 0, 0, width - p.feats.shape[1])) for p in parts]),
            torch.cat([F.pad(p.mask, (0, width - p.mask.shape[1]), value=False) for p in parts]),
            torch.cat([p.gold for p in parts]), torch.cat([p.fold for p in parts]))


def build_index(keys, steps: Sequence[Step], gold_ids: torch.Tensor, mem_ctx: torch.Tensor, names: Sequence[str],
                eps: float, device) -> PlusIndex:
    """One trie per key over the same steps and the same embedded contexts, and the tables read off them."""
    tries = [ExecutionTrie.build(steps, gold_ids, mem_ctx, len(names), k, eps, device) for k in keys]
    return PlusIndex.build(tries, names, mem_ctx.shape[1])


def inner_fold_candidates(steps: Sequence[Step], gold_ids: torch.Tensor, mem_ctx: torch.Tensor, vec: torch.Tensor,
                          keys, m: int, eps: float, names: Sequence[str], device, inner_folds: int = 5,
                          seed: int = 0) -> CandidateData:
    """Candidates of every training step, each scored by tries built from the other inner folds only.

    ``steps`` are split into ``inner_folds`` folds by group (:func:`tracer.core.folds.row_folds`,
    seeded); ``mem_ctx [S, d]``, ``vec [S, N]`` and ``gold_ids [S]`` are row-aligned with them.
    """
    groups = sorted({s.group for s in steps})
    if len(groups) < 2:  # nothing to hold out: no training data
        n_feat = len(feature_names(keys))
        return CandidateData(torch.zeros(0, 1, n_feat), torch.zeros(0, 1, dtype=torch.bool),
                             torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    parts = []
    for f, seen, held in row_folds([s.group for s in steps], inner_folds, seed):
        idx = build_index(keys, [steps[i] for i in seen.tolist()], gold_ids[seen], mem_ctx[seen.to(mem_ctx.device)],
                          names, eps, device)
        cand = candidates(idx, [steps[i] for i in held.tolist()], mem_ctx[held.to(mem_ctx.device)], vec[held], m)
        parts.append(CandidateData(cand.feats.cpu(), cand.mask.cpu(), cand.gold_index(gold_ids[held], IGNORE).cpu(),
                                   torch.full((len(held),), f)))
    return CandidateData.cat(parts)


def train_model(data: CandidateData, kind: str = "linear", hidden: int = 32, lr: float = 0.05,
                weight_decay: float = 1e-3, max_epochs: int = 500, patience: int = 50, seed: int = 0,
                val_fold: int | None = None, keep: torch.Tensor | None = None,
                refit: bool = False) -> tuple[CandidateModel, dict]:
    """Fit a :class:`CandidateModel` on out-of-fold candidates, early-stopped on one held-out inner fold.

    Full-batch Adam on ``NLL + weight_decay * sum(weights^2)``; the validation NLL is checked every
    epoch and the best epoch's weights are kept (stop after ``patience`` epochs without progress).
    Standardisation statistics come from the training rows' real candidates. With ``refit`` the
    model is then trained afresh on every covered step (validation fold included) for the best
    epoch count. Returns ``(model, history)``.
    """
    with one_thread():
        return _train(data, kind, hidden, lr, weight_decay, max_epochs, patience, seed, val_fold, keep, refit)


def _flat(data: CandidateData, model: CandidateModel) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardised rows of the real candidates ``[P, F]``, their (step, column) index and the gold of each step."""
    idx = data.mask.nonzero()                                                            # [P, 2]
    return model.standardise(data.feats[data.mask]), idx, data.gold


def _nll(model: CandidateModel, z: torch.Tensor, idx: torch.Tensor, gold: torch.Tensor, shape) -> tuple:
    s = model(z)                                                                         # [P]
    logits = torch.full(shape, _MASKED, dtype=s.dtype).index_put((idx[:, 0], idx[:, 1]), s)  # [S, C]
    loss = F.nll_loss(F.log_softmax(logits, dim=1), gold, ignore_index=IGNORE)
    correct = ((logits.argmax(1) == gold) & (gold != IGNORE)).sum()
    return loss, correct


def _train(data, kind, hidden, lr, weight_decay, max_epochs, patience, seed, val_fold, keep, refit):
    n_feat = data.feats.shape[2]
    model = CandidateModel(n_feat, kind, hidden, keep, seed)
    hist: dict[str, Any] = {"train_loss": [], "val_loss": [], "val_acc": []}
    covered = data.covered
    if val_fold is None:
        folds = sorted(set(data.fold[covered].tolist()))
        val_fold = folds[-1] if folds else IGNORE
    val = covered & (data.fold == val_fold)
    train = covered & ~val
    if not bool(train.any()) or not bool(val.any()):
        train, val = covered, covered.clone()  # too little data to hold a fold out: stop on the training loss
    hist.update(n_steps=len(data), n_uncovered=data.n_uncovered, n_train=int(train.sum()), n_val=int(val.sum()),
                val_fold=val_fold)
    if not bool(train.any()):
        hist.update(epochs=0, best_epoch=-1, best_val_loss=float("nan"), seconds_train=0.0)
        return model.eval(), hist
    tr = CandidateData(data.feats[train], data.mask[train], data.gold[train], data.fold[train])
    va = CandidateData(data.feats[val], data.mask[val], data.gold[val], data.fold[val])
    model.set_feature_stats(tr.feats[tr.mask])
    (ztr, itr, gtr), (zva, iva, gva) = _flat(tr, model), _flat(va, model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    stopper = EarlyStopping(model, patience)
    t0 = time.perf_counter()
    for epoch in range(max_epochs):
        model.train()
        loss, _ = _nll(model, ztr, itr, gtr, tr.mask.shape)
        opt.zero_grad()
        (loss + weight_decay * model.penalty()).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            vloss, vcorrect = _nll(model, zva, iva, gva, va.mask.shape)
        if stopper.step(epoch, float(loss.detach()), float(vloss), int(vcorrect) / max(len(va), 1)):
            break
    stopper.restore()
    best_epoch = stopper.best_epoch
    hist.update(stopper.curves, epochs=stopper.epochs, best_epoch=best_epoch, best_val_loss=stopper.best)
    if refit and not bool((train == covered).all()):
        # the early-stopped epoch count, now on every covered step (the validation fold included)
        model = CandidateModel(n_feat, kind, hidden, keep, seed)
        al = CandidateData(data.feats[covered], data.mask[covered], data.gold[covered], data.fold[covered])
        model.set_feature_stats(al.feats[al.mask])
        za, ia, ga = _flat(al, model)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        model.train()
        for _ in range(best_epoch + 1):
            loss, _ = _nll(model, za, ia, ga, al.mask.shape)
            opt.zero_grad()
            (loss + weight_decay * model.penalty()).backward()
            opt.step()
        hist["refit_epochs"] = best_epoch + 1
    hist["seconds_train"] = time.perf_counter() - t0
    return model.eval(), hist


# ---- the scorer ----------------------------------------------------------------------------------
