"""Fitting tracer_plus (:func:`fit_scorer`, what ``TracerPlusScorer.fit`` runs): its tries, its candidate
model (:mod:`tracer.scorers.tracer_plus.model`) trained on the shared stack, the guard's choice between that
model and the zero-shot ranking, and whether the request's open parts earn their slot. The model trains on
the out-of-fold candidates of :mod:`tracer.scorers.tracer_plus.inner_folds`, with the masked NLL over each
step's candidate set of :mod:`tracer.learn.nll` and the Adam + l2 + early-stopping loop of
:mod:`tracer.learn.trainer`.

Example::

    data = inner_fold_candidates(steps, gold_ids, mem, vec, keys, m, eps, names, device, 5, seed)
    model, history = train_model(data, "linear", 32, TrainConfig(...), keep=keep, refit=False)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tracer.core.folds import inner_seed
from tracer.core.threads import one_thread
from tracer.core.types import Trajectory
from tracer.learn.nll import IGNORE, MASKED, masked_nll
from tracer.learn.trainer import TrainConfig, train
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.ranking import reserved
from tracer.scorer_base.resources import Resources, fallback_scores, fit_steps, training_steps
from tracer.scorer_base.trial import explored_ids
from tracer.scorers.tracer_plus.inner_folds import CandidateData, clean_fold_view, inner_fold_candidates
from tracer.scorers.tracer_plus.model import CandidateModel, check_model, load_candidate_model

if TYPE_CHECKING:  # the scorer calls fit_scorer: annotations only
    from tracer.scorers.tracer_plus.scorer import TracerPlusScorer


def train_model(data: CandidateData, kind: str, hidden: int, cfg: TrainConfig, val_fold: int | None = None,
                keep: torch.Tensor | None = None, refit: bool = False, members: int = 1
                ) -> tuple[CandidateModel, dict]:
    """Fit a :class:`CandidateModel` on out-of-fold candidates, early-stopped on one held-out inner fold.

    Full-batch training (:func:`tracer.learn.trainer.train`, ``cfg.batch_size`` 0) on the masked NLL
    of the gold over each step's candidates; the best epoch's weights are kept. ``cfg.seed`` seeds the
    MLP's initial weights. Standardisation statistics come from the training rows' real candidates.
    With ``refit`` the model is then trained afresh on every covered step (validation fold included)
    for the best epoch count. ``members`` > 1 (``mlp``): that many MLPs, member ``i`` trained as a single
    MLP seeded ``cfg.seed + i`` (its own early stopping; the same rows, split and statistics), served as
    their mean (:class:`MlpEnsemble`); member 0 is the single MLP of ``members`` 1. Returns ``(model,
    history)``: member 0's curves, each member's best epoch, and the ensemble's validation NLL and accuracy.
    """
    check_model(kind, members)
    with one_thread():
        if members == 1:
            return _train(data, kind, hidden, cfg, val_fold, keep, refit)
        fits = [_train(data, kind, hidden, replace(cfg, seed=cfg.seed + i), val_fold, keep, refit)
                for i in range(members)]
    model = CandidateModel.mean_of([m for m, _ in fits])
    hist = dict(fits[0][1])
    hist.update(members=members, member_best_epochs=[h["best_epoch"] for _, h in fits],
                seconds_train=sum(h["seconds_train"] for _, h in fits))
    _, val = _split(data, hist["val_fold"])
    if bool(val.any()):
        with torch.no_grad():
            loss, correct = nll_on(model, _rows(data, val))()
        hist.update(ensemble_val_loss=float(loss), ensemble_val_acc=float(correct) / int(val.sum()))
    return model.eval(), hist


def nll_on(model: CandidateModel, data: CandidateData) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A closure ``loss()`` -> (masked NLL, n_correct) of ``data``'s steps under ``model``'s current weights.

    Only the real candidates are scored: their rows ``[P, F]`` are standardised once (with the
    model's statistics at closure time) and the scores scattered back to ``[S, C]`` logits."""
    dtype = next(model.net.parameters()).dtype  # float64 while an MLP trains (_wide)
    z = model.standardise(data.feats[data.mask].to(dtype))                              # [P, F]
    idx = data.mask.nonzero()                                                            # [P, 2]

    def loss(_batch: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        s = model(z)                                                                     # [P]
        # [S, C]
        logits = torch.full(data.mask.shape, MASKED, dtype=s.dtype).index_put((idx[:, 0], idx[:, 1]), s)
        return masked_nll(logits, data.mask, data.gold)

    return loss


def choose_open_slot(scores: torch.Tensor, data: CandidateData, claims: Sequence[tuple[int, ...]], k: int,
                     slots: int) -> dict:
    """Whether the request's open parts earn their reserved slot on these logs (``request.open_slot``).

    On the training steps, out of fold: the model's top k of its candidates by ``scores [S, C]`` (-inf where
    masked), with and without the open parts' claimants (``claims``, per training step) in the last
    ``slots`` slots (:func:`tracer.scorer_base.ranking.reserved`); the slot serves unless it loses recall@k.
    Where a turn's calls follow a procedure rather than the parts of its request (tau2's customer-service
    flows), the open parts' best matches are noise and the slot would cost recall; where requests list what
    to do (BFCL), it wins. The novel slots' claimants are left out of the comparison (the never-called tools
    of a fold are not those of the served index)."""
    order = torch.argsort(scores, dim=1, descending=True, stable=True)                  # [S, C]
    ranked = data.tool.gather(1, order)                                                 # [S, C]
    n_cand = data.mask.sum(1)                                                           # [S]
    gold = data.tool.gather(1, data.gold.clamp_min(0)[:, None])[:, 0]                   # [S]
    without = with_slot = 0
    # a gold outside the candidates is a miss either way (a claimant is always a candidate)
    for i in torch.nonzero(data.covered).squeeze(1).tolist():
        top = tuple(ranked[i, :min(k, int(n_cand[i]))].tolist())
        g = int(gold[i])
        without += g in top
        with_slot += g in reserved(top, claims[int(data.step[i])], k, slots)
    n = max(len(data), 1)
    return {"open_slot": with_slot >= without, "open_slot_recall": with_slot / n,
            "no_open_slot_recall": without / n}


def _rows(data: CandidateData, rows: torch.Tensor) -> CandidateData:
    return CandidateData(data.feats[rows], data.mask[rows], data.gold[rows], data.fold[rows])


def _split(data: CandidateData, val_fold: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(training rows, validation rows) ``[S]`` bool: covered steps outside / inside ``val_fold``."""
    covered = data.covered
    val = covered & (data.fold == val_fold)
    train_rows = covered & ~val
    if not bool(train_rows.any()) or not bool(val.any()):
        # too little data to hold a fold out: stop on the training loss
        train_rows, val = covered, covered.clone()
    return train_rows, val


def _wide(model: CandidateModel) -> CandidateModel:
    """An MLP trains in float64 (its weights rounded to float32 after :func:`_train`). Why: its fit is not
    convex, and the last bits of float32 kernels, which differ between processors (AVX2 / AVX-512 code paths
    of one host already), grew into other trained weights and other held-out recall (the ablation's ``mlp``
    row moved by up to 0.008 recall@5 in a fold). In float64 those differences stay below what the rounding
    to float32 keeps. The linear model's fit is convex from zero; it stays float32, as its rows reproduce."""
    if model.kind == "mlp":
        model.net.double()
    return model


def _train(data: CandidateData, kind: str, hidden: int, cfg: TrainConfig, val_fold: int | None,
           keep: torch.Tensor | None, refit: bool) -> tuple[CandidateModel, dict]:
    n_feat = data.feats.shape[2]
    model = CandidateModel(n_feat, kind, hidden, keep, cfg.seed)
    hist: dict[str, Any] = {"train_loss": [], "val_loss": [], "val_acc": []}
    covered = data.covered
    if val_fold is None:
        folds = sorted(set(data.fold[covered].tolist()))
        val_fold = folds[-1] if folds else IGNORE
    train_rows, val = _split(data, val_fold)
    hist.update(n_steps=len(data), n_uncovered=data.n_uncovered, n_train=int(train_rows.sum()),
                n_val=int(val.sum()), val_fold=val_fold)
    if not bool(train_rows.any()):
        hist.update(epochs=0, best_epoch=-1, best_val_loss=float("nan"), seconds_train=0.0)
        return model.eval(), hist
    t0 = time.perf_counter()
    tr, va = _rows(data, train_rows), _rows(data, val)
    _wide(model.set_feature_stats(tr.feats[tr.mask]))
    train_loss, val_loss = nll_on(model, tr), nll_on(model, va)
    run = train(model, lambda idx: train_loss(idx)[0], val_loss, len(tr), len(va), replace(cfg, batch_size=0))
    best_epoch = run["best_epoch"]
    hist.update({k: run[k] for k in ("train_loss", "val_loss", "val_acc")}, epochs=run["epochs"],
                best_epoch=best_epoch, best_val_loss=run["best_val_loss"])
    if refit and not bool((train_rows == covered).all()):
        # the early-stopped epoch count, now on every covered step (the validation fold included)
        model = CandidateModel(n_feat, kind, hidden, keep, cfg.seed)
        every = _rows(data, covered)
        _wide(model.set_feature_stats(every.feats[every.mask]))
        every_loss = nll_on(model, every)
        train(model, lambda idx: every_loss(idx)[0], None, len(every), 0,
              replace(cfg, batch_size=0, max_epochs=best_epoch + 1))
        hist["refit_epochs"] = best_epoch + 1
    hist["seconds_train"] = time.perf_counter() - t0
    model.net.float()
    return model.eval(), hist


def fit_scorer(scorer: TracerPlusScorer, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
    """``scorer``'s tries and candidate model from ``trajectories``, the guard's choice and the open slot's;
    the report holds the curves, the scorer their scalars (``history``)."""
    t0 = time.perf_counter()
    # no trajectories: a cold start with transferred weights or a guard; none learnable: an error
    pick = training_steps if scorer.transfer or (scorer.zero.guard and not trajectories) else fit_steps
    steps = pick(trajectories, res.registry, scorer.successful_only)
    mem, q = scorer.embed(steps, res)                                       # [S, d] each
    t1 = time.perf_counter()
    vec = fallback_scores(res, q)                                           # [S, N]
    gold = res.tool_ids([s.gold for s in steps])                            # [S]
    cfg = scorer.head_cfg
    seed = res.seed if cfg.get("seed") is None else int(cfg["seed"])
    evidence = (lambda r: scorer.request.inputs(steps, r)) if scorer.request else None
    request = evidence(res) if evidence else None                          # the steps' request evidence
    view = clean_fold_view(res, steps, lambda r: scorer.embed(steps, r), evidence)
    folds = int(cfg["inner_folds"])
    if scorer.transfer:  # a transferred model's guard may see fewer groups than that
        folds = max(2, min(folds, len({s.group for s in steps})))

    @cache
    def zero_shot() -> np.ndarray:
        """``[S, N]`` the training steps' zero-shot scores, usage vectors from the other inner folds: computed
        once for the guard and the fusion's candidates."""
        usage = scorer.usage.inner(steps, gold, mem, q, vec, res.tool_index.vectors, folds,
                                   inner_seed(seed, 0))                                       # [S, N]
        return scorer.zero.scores(steps, usage.numpy(), res, scorer.query_rendering)

    def fusion(held: torch.Tensor, held_vec: torch.Tensor) -> torch.Tensor:
        """The held rows' fusion scores ``[h, N]``; under a clean encoder's view, from its own vector
        scores ``held_vec [h, N]``."""
        if view is None:
            return torch.from_numpy(zero_shot()[held.numpy()]).to(held_vec.device)
        held_steps = [steps[i] for i in held.tolist()]
        zs = scorer.zero.scores(held_steps, held_vec.cpu().numpy(), res, scorer.query_rendering)
        return torch.from_numpy(zs).to(held_vec.device)

    def inner() -> CandidateData:
        return inner_fold_candidates(steps, gold, mem, vec, scorer.keys, scorer.m, scorer.eps,
                                     res.registry.names, res.device, folds, inner_seed(seed, 0),
                                     fold_view=view, approximate=not res.tool_index.exact,
                                     fusion=fusion if scorer.zero.candidates else None, request=request)

    # the guard, over the trial conversations' steps where the logs hold enough (tracer/scorer_base/trial.py)
    explored = explored_ids(trajectories) if scorer.zero.trial else set()

    def guard(scores: torch.Tensor, data: CandidateData) -> dict:
        hits = scorer.zero.hits(zero_shot(), gold.numpy())                                   # [S]
        return scorer.zero.judge(scores, data, hits, steps, explored, transferred=bool(scorer.transfer))

    hidden = int(cfg["hidden"])
    if scorer.transfer:  # cold start: weights learned on other datasets (the features are dataset-agnostic)
        scorer.model = load_candidate_model(scorer.transfer, scorer.feature_names, scorer.model_kind, hidden,
                                            scorer.members)
        hist = {}
        if scorer.zero.guard and steps:  # the transferred weights must beat the zero-shot ranking here too
            data = inner()
            with torch.no_grad():
                scores = scorer.model.scores(data.feats, data.mask).cpu()                    # [S, C]
            hist = guard(scores, data)
        t2 = time.perf_counter()
    elif not steps:  # no logs: untrained weights, never served (the first refit trains them)
        scorer.model = CandidateModel(len(scorer.feature_names), scorer.model_kind, hidden, scorer.keep, seed,
                                      scorer.members)
        # an online update gives the tries their first calls without a refit: the zero-shot ranking must go
        # on serving until a fit has trained the weights and the guard has judged them
        hist, t2 = {"serves": "zero_shot"}, time.perf_counter()
    else:
        data = inner()
        t2 = time.perf_counter()
        scorer.model, hist = train_model(data, scorer.model_kind, hidden, scorer.train_config(seed),
                                         keep=scorer.keep, refit=bool(cfg["refit"]), members=scorer.members)
        with torch.no_grad():
            scorer.inner_scores = scorer.model.scores(data.feats, data.mask).cpu()           # [S, C]
        if scorer.zero.guard:
            hist.update(guard(scorer.inner_scores, data))
        if request is not None and request.claims is not None:  # does the open parts' slot pay here?
            hist.update(choose_open_slot(scorer.inner_scores, data, request.claims, scorer.zero.k,
                                         scorer.reserve_slots))
    if explored:  # a gateway's own logs: the gate reads this (``gates``)
        hist["own_logs"] = True
    scorer.attach([ExecutionTrie.build(steps, gold, mem, len(res.registry), k, scorer.eps, res.device)
                   for k in scorer.keys], res)
    history = {**hist, "seconds_embed": t1 - t0, "seconds_inner": t2 - t1,
               "seconds_fit": time.perf_counter() - t1}
    scorer.history = {k: v for k, v in history.items() if not isinstance(v, list)}
    return FitReport(scorer.name, len(trajectories), len(steps), time.perf_counter() - t0, history)
