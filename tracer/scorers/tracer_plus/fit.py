"""Training tracer_plus's candidate model (:mod:`tracer.scorers.tracer_plus.model`) on the shared stack:
out-of-fold candidates by :mod:`tracer.learn.oof` (no step scored by an index that saw its own trajectory),
the masked NLL over each step's candidate set of :mod:`tracer.learn.nll`, and the Adam + l2 + early-stopping
loop of :mod:`tracer.learn.trainer`.

Example::

    data = inner_fold_candidates(steps, gold_ids, mem, vec, keys, m, eps, names, device, 5, seed)
    model, history = train_model(data, "linear", 32, TrainConfig(...), keep=keep, refit=False)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from tracer.core.threads import one_thread
from tracer.core.types import Step
from tracer.learn.nll import IGNORE, MASKED, masked_nll
from tracer.learn.oof import out_of_fold, pad_cat
from tracer.learn.trainer import TrainConfig, train
from tracer.memory.trie import ExecutionTrie
from tracer.scorers.tracer_plus.features import candidates, feature_names
from tracer.scorers.tracer_plus.index import PlusIndex
from tracer.scorers.tracer_plus.model import CandidateModel, check_model
from tracer.scorers.tracer_plus.request import RequestInput
from tracer.scorers.tracer_plus.step import candidates_rows
from tracer.scoring.ranking import reserved
from tracer.scoring.resources import Resources, fallback_scores

# held rows [h] -> (memory contexts [S, d], vector scores [S, N]) of every step under an encoder that never
# saw them
FoldView = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, RequestInput | None]]


# ---- training data -------------------------------------------------------------------------------
@dataclass
class CandidateData:
    """Out-of-fold candidates of the training steps: raw features, gold position, inner fold."""

    feats: torch.Tensor   # [S, C, F]
    mask: torch.Tensor    # [S, C]
    gold: torch.Tensor    # [S] candidate index, IGNORE where the gold is not a candidate
    fold: torch.Tensor    # [S] inner fold the step was held out in
    tool: torch.Tensor | None = None  # [S, C] the candidates' registry ids (0 where masked)
    step: torch.Tensor | None = None  # [S] each row's index in the training steps
    state: torch.Tensor | None = None  # [S] bool: the first key's state has children (the logs know it)

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
        known = all(p.tool is not None and p.step is not None for p in parts)
        stated = all(p.state is not None for p in parts)
        return CandidateData(
            pad_cat([p.feats for p in parts], width, 0.0), pad_cat([p.mask for p in parts], width, False),
            torch.cat([p.gold for p in parts]), torch.cat([p.fold for p in parts]),
            pad_cat([p.tool for p in parts], width, 0) if known else None,
            torch.cat([p.step for p in parts]) if known else None,
            torch.cat([p.state for p in parts]) if stated else None)


def build_index(keys, steps: Sequence[Step], gold_ids: torch.Tensor, mem_ctx: torch.Tensor,
                names: Sequence[str], eps: float, device) -> PlusIndex:
    """One trie per key over the same steps and the same embedded contexts, and the tables read off them."""
    tries = [ExecutionTrie.build(steps, gold_ids, mem_ctx, len(names), k, eps, device) for k in keys]
    return PlusIndex.build(tries, names, mem_ctx.shape[1])


def inner_fold_candidates(steps: Sequence[Step], gold_ids: torch.Tensor, mem_ctx: torch.Tensor,
                          vec: torch.Tensor, keys, m: int, eps: float, names: Sequence[str], device,
                          inner_folds: int = 5, seed: int = 0, fold_view: FoldView | None = None,
                          approximate: bool = False,
                          fusion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                          request: RequestInput | None = None) -> CandidateData:
    """Candidates of every training step, each scored by tries built from the other inner folds only.

    ``steps`` are split into ``inner_folds`` folds by group (:func:`tracer.core.folds.row_folds`,
    seeded); ``mem_ctx [S, d]``, ``vec [S, N]`` and ``gold_ids [S]`` are row-aligned with them.
    ``fold_view(held)``, when given, returns ``(mem_ctx, vec, request)`` of every step under an encoder that
    never saw the held rows' trajectories (a fine-tuned encoder: the one passed in saw every inner fold); its
    ``request`` is the request evidence under that encoder (the semantic part reads it).
    ``approximate``: ``vec`` comes from an approximate tool index (:func:`candidates_rows`).
    ``fusion(held, vec_held)``: the zero-shot fusion's scores ``[h, N]`` of the held rows from their vector
    scores (``zero_shot.candidates``: its top m join the candidates, with its features).
    ``request``: every step's request evidence, row-aligned with ``steps`` (``request``: its top BM25
    matches join the candidates, with its features).
    """
    groups = sorted({s.group for s in steps})
    if len(groups) < 2:  # nothing to hold out: no training data
        columns = feature_names(keys, fusion is not None, request.features if request is not None else ())
        n_feat = len(columns)
        return CandidateData(torch.zeros(0, 1, n_feat), torch.zeros(0, 1, dtype=torch.bool),
                             torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                             torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                             torch.zeros(0, dtype=torch.bool))
    views: dict[int, tuple[torch.Tensor, torch.Tensor, RequestInput | None]] = {}

    def build(seen: torch.Tensor, f: int) -> PlusIndex:
        if fold_view is not None:  # held = every row not seen (the folds partition the rows)
            held = torch.ones(len(steps), dtype=torch.bool)
            held[seen] = False
            views[f] = fold_view(held.nonzero().squeeze(1))
        mem = views[f][0] if f in views else mem_ctx
        return build_index(keys, [steps[i] for i in seen.tolist()], gold_ids[seen], mem[seen.to(mem.device)],
                           names, eps, device)

    def score(idx: PlusIndex, held: torch.Tensor, f: int) -> CandidateData:
        mem, v, evidence = views.pop(f, (mem_ctx, vec, request))
        make = candidates_rows if approximate else candidates
        zs = None if fusion is None else fusion(held, v[held])                            # [h, N]
        req = None if evidence is None else evidence.take(held.tolist())
        cand = make(idx, [steps[i] for i in held.tolist()], mem[held.to(mem.device)], v[held], m, zs, req)
        return CandidateData(cand.feats.cpu(), cand.mask.cpu(), cand.gold_index(gold_ids[held], IGNORE).cpu(),
                             torch.full((len(held),), f), cand.tool.cpu(), held.cpu(),
                             cand.in_state[:, 0].cpu())

    return CandidateData.cat(out_of_fold([s.group for s in steps], inner_folds, seed, build, score))


def clean_fold_view(res: Resources, steps: Sequence[Step],
                    embed: Callable[[Resources], tuple[torch.Tensor, torch.Tensor]],
                    request: Callable[[Resources], RequestInput] | None = None) -> FoldView | None:
    """The :data:`FoldView` of a fine-tuned encoder (``res.without`` set), else None. ``embed(r)`` is the
    scorer's ``(memory, query)`` contexts of ``steps`` under ``r``; the vector scores come from ``r``'s tool
    index; ``request(r)`` the steps' request evidence under ``r`` (None: no request evidence)."""
    if res.without is None:
        return None

    def view(held: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = res.without(frozenset(steps[i].group for i in held.tolist()))
        mem, q = embed(r)                                                                   # [S, d] each
        return mem, fallback_scores(r, q), None if request is None else request(r)          # [S, N]
    return view


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
    ``slots`` slots (:func:`tracer.scoring.ranking.reserved`); the slot serves unless it loses recall@k.
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
