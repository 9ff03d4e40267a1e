"""``tracer_plus``: a multi-key candidate union scored by a learned candidate model.

Beyond the paper. At a turn opening (63% of BFCL steps) the paper's turn-local prefix is the root,
whose ~73 children make the empirical prior nearly useless; the previous call across turns and
the latest user request say much more. So instead of one trie and a fixed blend:

1. *Candidates* (:mod:`tracer.plus_features`): the union of the children of the step's state
   under each configured key (default: turn-local prefix, last 2 calls across turns, last call
   across turns; one trie per key, built once, all sharing the same embedded training contexts)
   and the top ``vector_candidates`` (m) tools of the vector ranking.
2. *Features* per candidate and key: membership, log P, log R (contextual prior), the raw edge
   cosine, the state's visits and children and their products with the candidate's features;
   plus the vector cosine, log rank and top-m flag. Neutral values outside a key's children are
   documented in :mod:`tracer.plus_features`. Features are standardised with the training split's
   mean and SD (buffers stored beside the weights) and clipped to +-8 SD.
3. *Model* (:class:`CandidateModel`): linear ``s(t) = w . z(t)`` (default) or a small MLP
   (``model: mlp``), trained by softmax NLL of the gold tool over the candidate set (DPR's
   ``BiEncoderNllLoss`` shape), Adam plus an l2 penalty on the weights, early stopping on one held
   out inner fold, seeded and deterministic on the CPU.

Training without leakage (:func:`inner_fold_candidates`): the training trajectories are split
into inner folds by group; the tries that score the steps of inner fold f are built from the
other folds only, so no training step is ever scored by an index that saw its own trajectory.
Steps whose gold is not a candidate carry no gradient; they are counted (``n_uncovered``), and at
test time each step's coverage is reported in ``Scores.extra["in_candidates"]`` (1 / 0, -1 when
the step's gold is unknown or not in the registry).

Context renderings: ``query_context`` renders the vector query (vector features and the padding
order), ``memory_context`` the contexts stored in and compared with the edge memories; both
default to the latest user message plus the calls since (measured best on BFCL, see the config).

Ranking: candidates by model score; the rest of the registry after them in vector order
(``pad``); a step without any candidate (``vector_candidates: 0`` and unseen states) falls back
to the vector ranking. ``in_trie`` is True when any key's state has children.

References: DPR (Karpukhin et al., 2020) for the NLL over a candidate set; the TRACER paper for
the trie, its two priors and the edge memories; ToolNet (Liu et al., 2024) for the previous-call key.

Example::

    scorer = build_scorer("tracer_plus").fit(train_trajectories, res)
    sel = finalize(scorer.score(steps), k=5)            # batched
    names = scorer.select(messages, k=5)                # one live conversation
    scorer.save("index/"); TracerPlusScorer.load("index/", embedder)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..context import ContextRendering
from ..early_stopping import EarlyStopping
from ..folds import inner_seed, row_folds
from ..io import atomic_save
from ..plus_features import (
    DEFAULT_KEYS,
    Candidates,
    OneCandidates,
    PlusIndex,
    candidates,
    candidates_one,
    feature_names,
    keep_mask,
    parse_key,
)
from ..steps import step_from_messages
from ..store import Verify, save_snapshot
from ..threads import one_thread
from ..trie import ExecutionTrie
from ..types import Step, Trajectory
from . import register_scorer
from .base import (
    Resources,
    Scores,
    as_numpy,
    fallback_scores,
    fit_steps,
    rank_one,
    scatter_primary,
    training_steps,
)
from .persist import check_trie, load_tensors, open_index, write_common
from .tracer import confidence

FORMAT_VERSION = 1
CLASS_PATH = "tracer.scorers.tracer_plus.TracerPlusScorer"
IGNORE = -100            # gold index of a step whose gold is not a candidate
_MASKED = -1e9           # logit of a padded candidate inside the loss
_Z_CLIP = 8.0            # standardised features clipped to +- this many SD
# join_users: a request left without a call is read with the message after it (BFCL's withheld-function
# and clarification turns); +0.035 recall@5 on BFCL, no change on tau2 and API-Bank (docs/results.md, ablation)
DEFAULT_CONTEXT = {"window": "since_user", "calls": "names", "results": "none", "join_users": True}
DEFAULT_HEAD = {"inner_folds": 5, "lr": 0.05, "weight_decay": 1e-3, "max_epochs": 500, "patience": 50,
                "hidden": 32, "refit": False}


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

    ``steps`` are split into ``inner_folds`` folds by group (:func:`tracer.folds.row_folds`,
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
class TracerPlusScorer:
    """Multi-key candidate union with a learned candidate scorer (see the module docstring).

    Args:
        name: registry name.
        keys: state keys, as labels (``prefix``, ``last_2+cross_turn``, ``last_1+cross_turn``, ...)
            or ``{kind, n, cross_turn}`` mappings; one trie each.
        vector_candidates: m, the top of the vector ranking added to the candidates (0: none).
        query_context: rendering of the vector query (vector features and padding).
        memory_context: rendering of the contexts of the edge memories (and of the step compared with them).
        features: ``{drop: [...]}`` feature groups (or full names) left out, for ablations.
        model: ``linear`` or ``mlp``.
        eps: smoothing inside both priors' logs.
        pad: fill the presented set up to k from the vector ranking.
        successful_only: learn from successful trajectories only.
        head: training settings: ``inner_folds``, ``lr``, ``weight_decay``, ``max_epochs``, ``patience``,
            ``hidden`` (MLP width), ``seed`` (default: the resources' seed).
        transfer: path of a candidate model saved by :func:`save_candidate_model` (trained on other
            datasets): ``fit`` then builds the tries only and keeps these weights; zero trajectories
            are allowed (cold start). ``None``: train on the fitted trajectories.
    """

    def __init__(self, name: str = "tracer_plus", keys: Sequence = DEFAULT_KEYS, vector_candidates: int = 10,
                 query_context: Mapping | None = None, memory_context: Mapping | None = None,
                 features: Mapping | None = None, model: str = "linear", eps: float = 1e-6, pad: bool = True,
                 successful_only: bool = True, head: Mapping | None = None, transfer: str | None = None, **_: Any):
        self.name, self.pad, self.eps, self.successful_only = name, pad, eps, successful_only
        self.transfer = str(transfer) if transfer else None
        self.keys = tuple(parse_key(k) for k in keys)
        if not self.keys and vector_candidates <= 0:
            raise ValueError("tracer_plus needs at least one key or vector_candidates > 0")
        self.m = int(vector_candidates)
        self.query_rendering = ContextRendering.from_config(DEFAULT_CONTEXT if query_context is None else query_context)
        self.memory_rendering = ContextRendering.from_config(DEFAULT_CONTEXT if memory_context is None
                                                             else memory_context)
        self.drop = tuple((features or {}).get("drop") or ())
        self.model_kind = model
        self.head_cfg = {**DEFAULT_HEAD, **dict(head or {})}
        self.feature_names = feature_names(self.keys)
        self.keep = keep_mask(self.feature_names, self.drop)
        if model not in ("linear", "mlp"):
            raise ValueError(f"model must be linear or mlp, got {model!r}")
        self.res: Resources | None = None
        self.index: PlusIndex | None = None
        self.model: CandidateModel | None = None
        self.history: dict = {}

    # ---- fitting -----------------------------------------------------------------------------
    def embed(self, steps: Sequence[Step], res: Resources | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(memory contexts ``[B, d]``, query contexts ``[B, d]``); one encode when the renderings agree."""
        res = res or self.res
        mem = res.embed(steps, self.memory_rendering)
        q = mem if self.query_rendering == self.memory_rendering else res.embed(steps, self.query_rendering)
        return mem, q

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> TracerPlusScorer:
        t0 = time.perf_counter()
        # with transferred weights an empty log is a cold start (the tries start empty); else it is an error
        pick = training_steps if self.transfer else fit_steps
        steps = pick(trajectories, res.registry, self.successful_only)
        mem, q = self.embed(steps, res)                                         # [S, d] each
        t1 = time.perf_counter()
        vec = fallback_scores(res, q)                                           # [S, N]
        gold = res.tool_ids([s.gold for s in steps])                            # [S]
        cfg = self.head_cfg
        seed = res.seed if cfg.get("seed") is None else int(cfg["seed"])
        if self.transfer:  # cold start: weights learned on other datasets (the features are dataset-agnostic)
            self.model, hist, t2 = load_candidate_model(self.transfer, self.feature_names,
                                                         self.model_kind), {}, time.perf_counter()
        else:
            data = inner_fold_candidates(steps, gold, mem, vec, self.keys, self.m, self.eps, res.registry.names,
                                         res.device, int(cfg["inner_folds"]), inner_seed(seed, 0))
            t2 = time.perf_counter()
            self.model, hist = train_model(data, self.model_kind, int(cfg["hidden"]), float(cfg["lr"]),
                                           float(cfg["weight_decay"]), int(cfg["max_epochs"]),
                                           int(cfg["patience"]), seed, keep=self.keep, refit=bool(cfg["refit"]))
        self.attach([ExecutionTrie.build(steps, gold, mem, len(res.registry), k, self.eps, res.device)
                     for k in self.keys], res)
        self.history = {**{k: v for k, v in hist.items() if not isinstance(v, list)}, "seconds_embed": t1 - t0,
                        "seconds_inner": t2 - t1, "seconds_fit": time.perf_counter() - t1,
                        "val_loss": hist.get("val_loss", [])}
        return self

    def attach(self, tries: Sequence[ExecutionTrie], res: Resources) -> TracerPlusScorer:
        if [t.key for t in tries] != list(self.keys):
            raise ValueError(f"tries have keys {[t.key.label for t in tries]}, this scorer {[k.label for k in self.keys]}")
        if any(t.n_tools != len(res.registry) for t in tries):
            raise ValueError(f"tries are not over the registry's {len(res.registry)} tools")
        self.res = res
        self.index = PlusIndex.build(tries, res.registry.names, res.embedder.dim)
        return self

    @property
    def tries(self) -> list[ExecutionTrie]:
        return self.index.tries if self.index is not None else []

    def _check_fitted(self) -> None:
        if self.res is None or self.model is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted: call fit(trajectories, resources) or load()")

    # ---- scoring (batched) -------------------------------------------------------------------
    def candidates(self, steps: Sequence[Step], mem: torch.Tensor, vec: torch.Tensor) -> Candidates:
        return candidates(self.index, steps, mem, vec, self.m)

    def score(self, steps: Sequence[Step]) -> Scores:
        self._check_fitted()
        mem, q = self.embed(steps)
        return self.score_embedded(steps, mem, q)

    def score_embedded(self, steps: Sequence[Step], mem: torch.Tensor, query: torch.Tensor | None = None) -> Scores:
        """Score steps whose contexts are embedded: ``mem [B, d]`` (memory rendering), ``query [B, d]``
        (query rendering; default ``mem``). A single step takes the numpy fast path (same numbers)."""
        self._check_fitted()
        query = mem if query is None else query
        if len(steps) == 1:
            return self._score_single(steps[0], as_numpy(mem[0]), as_numpy(query[0]))
        n = len(self.res.registry)
        vec = fallback_scores(self.res, query)                                  # [B, N]
        cand = self.candidates(steps, mem, vec)
        s = self.model.scores(cand.feats, cand.mask)                            # [B, C]
        has = cand.mask.any(1)                                                  # [B]
        return Scores(
            primary=scatter_primary(cand.tool, cand.mask, s, n).cpu(),
            fallback=vec,
            fell_back=(~has).cpu(),
            in_trie=cand.in_state.any(1).cpu(),
            kappa=confidence(s).float().cpu(),
            depth=cand.depth.cpu(),
            n_children=cand.mask.sum(1).cpu(),
            extra={"in_candidates": self._coverage(steps, cand.tool, cand.mask)},
        )

    def _coverage(self, steps: Sequence[Step], tool: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[B]`` 1.0 if the step's gold is a candidate, 0.0 if not, -1.0 if unknown."""
        reg = self.res.registry
        gold = torch.tensor([reg.id(s.gold) if s.gold in reg else -1 for s in steps], dtype=torch.long)
        hit = (mask.cpu() & (tool.cpu() == gold[:, None])).any(1).float()
        return torch.where(gold >= 0, hit, -1.0)

    # ---- scoring (one step) ------------------------------------------------------------------
    def _one(self, step: Step, memory, query=None) -> tuple[OneCandidates, np.ndarray, np.ndarray]:
        """(candidates, scores [C] float32, vector scores [N] float32) of one step: numpy, CPU."""
        self._check_fitted()
        mem = as_numpy(memory)
        q = mem if query is None else as_numpy(query)
        vec = self.res.tool_index.dense_scores_one(q)                           # [N]
        one = candidates_one(self.index, step, mem, vec, self.m)
        s = self.model.scores_one(one.feats) if len(one.tool) else np.zeros(0, np.float32)
        return one, s, vec

    def _score_single(self, step: Step, mem: np.ndarray, q: np.ndarray) -> Scores:
        """:meth:`score_embedded` for one step through the numpy path."""
        one, s, vec = self._one(step, mem, q)
        t, s_t = torch.from_numpy(one.tool)[None], torch.from_numpy(s)[None]    # [1, C]
        every = torch.ones_like(t, dtype=torch.bool)
        return Scores(primary=scatter_primary(t, every, s_t, len(self.res.registry)),
                      fallback=torch.from_numpy(vec)[None], fell_back=torch.tensor([len(one.tool) == 0]),
                      in_trie=torch.tensor([bool(one.in_state.any())]), kappa=confidence(s_t).float(),
                      depth=torch.tensor([one.depth]), n_children=torch.tensor([len(one.tool)]),
                      extra={"in_candidates": self._coverage([step], t, every)})

    def select_one(self, step: Step, memory, k: int, query=None, pad: bool | None = None) -> tuple[int, ...]:
        """The presented set of one step: registry ids, as :func:`finalize` would present them.

        Not :func:`finalize_one`: candidate scores are always finite and the vector order is already
        at hand (``one.order``), so a lexsort of the candidates (score desc, vector score desc,
        registry id) followed by that order gives the same set with less work on the per-step hot
        path (``scripts/bench_tracer_plus.py`` times it); tested equal to the batched path."""
        pad = self.pad if pad is None else pad
        one, s, vec = self._one(step, memory, query)
        if not len(one.tool):
            return tuple(one.order[:k].tolist())
        head = one.tool[np.lexsort((one.tool, -vec[one.tool], -s))][:k]
        if len(head) == k or not pad:
            return tuple(head.tolist())
        rest = one.order[:k + len(head)]
        return tuple(head.tolist()) + tuple(rest[~np.isin(rest, head)][:k - len(head)].tolist())

    def rank_one(self, step: Step, memory, query=None, top: int | None = None) -> np.ndarray:
        """The ranking of one step, registry ids best first (the first ``top`` only when given)."""
        one, s, vec = self._one(step, memory, query)
        return rank_one(one.tool, s, vec, len(one.tool) == 0, top)

    def select(self, messages: Sequence[Mapping[str, Any]], k: int = 5) -> list[str]:
        """Tool names to present for the next call of a live conversation (OpenAI chat messages)."""
        self._check_fitted()
        step = step_from_messages(messages)
        mem, q = self.embed([step])
        names = self.res.registry.names
        return [names[i] for i in self.select_one(step, mem[0], k, q[0])]

    # ---- persistence -------------------------------------------------------------------------
    def config(self) -> dict:
        return {"name": self.name, "keys": [asdict(k) for k in self.keys], "vector_candidates": self.m,
                "query_context": asdict(self.query_rendering), "memory_context": asdict(self.memory_rendering),
                "features": {"drop": list(self.drop)}, "model": self.model_kind, "eps": self.eps, "pad": self.pad,
                "successful_only": self.successful_only, "head": dict(self.head_cfg), "transfer": self.transfer}

    def describe(self) -> dict:
        out = {"scorer": self.name, "keys": [k.label for k in self.keys], "vector_candidates": self.m,
               "model": self.model_kind, "features": list(self.feature_names), "dropped": list(self.drop)}
        if self.model is not None:
            out["fit"] = {k: v for k, v in self.history.items() if not isinstance(v, list)}
            if self.model_kind == "linear":
                out["weights"] = dict(zip(self.feature_names, self.model.net.weight.detach().cpu()[0].tolist()))
        return out

    def save(self, directory: str | Path) -> Path:
        """Write the index as a new snapshot of ``directory`` (:func:`tracer.store.save_snapshot`: atomic
        for readers, verified by a manifest; a directory that is not a tracer index is refused).

        Files: ``meta.json`` (format version, class, config, embedder name and dim, feature names,
        trie sizes, fit summary), ``tools.json`` (the registry), ``trie_<j>.pt`` (one per key),
        ``model.pt`` (weights and the standardisation buffers), ``tools.faiss`` +
        ``tools_idmap.json`` + ``tool_vectors.npy`` (the vector index and its id map).
        """
        self._check_fitted()
        out = Path(directory)
        with save_snapshot(out) as tmp:
            write_common(tmp, {"format_version": FORMAT_VERSION, "class": CLASS_PATH, "scorer": self.config(),
                               "features": list(self.feature_names),
                               "tries": [{"key": t.key.label, "n_nodes": t.n_nodes, "n_edges": t.n_edges}
                                         for t in self.tries],
                               "fit": {k: v for k, v in self.history.items() if not isinstance(v, list)}}, self.res)
            for j, trie in enumerate(self.tries):
                torch.save(trie.state_dict(), tmp / f"trie_{j}.pt")
            torch.save(self.model.state_dict(), tmp / "model.pt")
        return out

    @classmethod
    def load(cls, directory: str | Path, embedder, device: str | None = None, verify: Verify = "sha256"
             ) -> TracerPlusScorer:
        """Load a saved index with the checks of :meth:`TracerScorer.load`, and the feature names'."""
        with open_index(directory, embedder, CLASS_PATH, FORMAT_VERSION, device, verify) as (d, meta, res):
            obj = cls(**meta["scorer"])
            if list(obj.feature_names) != meta["features"]:
                raise ValueError(f"{d / 'meta.json'}: feature names differ from this version's; rebuild the index")
            tries = [check_trie(ExecutionTrie.from_state_dict(load_tensors(d / f"trie_{j}.pt"), res.device),
                                res, d / f"trie_{j}.pt")
                     for j in range(len(obj.keys))]
            obj.attach(tries, res)
            obj.model = CandidateModel.from_state_dict(load_tensors(d / "model.pt"), obj.model_kind,
                                                       int(obj.head_cfg["hidden"]))
            obj.history = dict(meta.get("fit") or {})
        return obj


@register_scorer("tracer_plus")
def tracer_plus(**cfg) -> TracerPlusScorer:
    return TracerPlusScorer(**{"name": "tracer_plus", **cfg})
