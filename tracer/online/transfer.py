"""Cold start: a tracer_plus candidate model trained on other datasets, for a dataset with few or no logs.

The candidate features (:mod:`tracer.scorers.tracer_plus.features`) are dataset-agnostic: memberships, priors
and cosines of each key's state, the state's visits and children, the vector cosine and rank. So the
out-of-fold candidates of several source datasets (each scored by tries of its own inner folds, over its own
registry) are pooled and one model is trained on them; a scorer configured with ``transfer: PATH`` then fits
its tries on the target's trajectories (none at all is allowed) and keeps these weights.

    model = fit_transfer_model(build_scorer("tracer_plus"), [(bfcl_trajs, bfcl_res), (tau2_trajs, tau2_res)])
    save_candidate_model(model, scorer.feature_names, "transfer.pt")
    cold = build_scorer("tracer_plus", transfer="transfer.pt")
    cold.fit([], apibank_res)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tracer.core.folds import inner_seed
from tracer.core.types import Trajectory
from tracer.scorer_base.resources import Resources, fallback_scores, training_steps
from tracer.scorers.tracer_plus import TracerPlusScorer
from tracer.scorers.tracer_plus.fit import train_model
from tracer.scorers.tracer_plus.inner_folds import CandidateData, inner_fold_candidates
from tracer.scorers.tracer_plus.model import CandidateModel


def source_candidates(scorer: TracerPlusScorer, trajectories: Sequence[Trajectory], res: Resources,
                      fold_offset: int = 0) -> CandidateData:
    """Out-of-fold candidates of one source dataset, as ``scorer.fit`` builds them (inner folds
    renumbered from ``fold_offset`` so that sources never share a fold)."""
    steps = training_steps(trajectories, res.registry, scorer.successful_only)
    mem, q = scorer.embed(steps, res)                                                  # [S, d] each
    vec = fallback_scores(res, q)                                                      # [S, N]
    gold = res.tool_ids([s.gold for s in steps])                                       # [S]
    cfg = scorer.head_cfg
    seed, folds = (res.seed if cfg.get("seed") is None else int(cfg["seed"])), int(cfg["inner_folds"])
    # the same feature columns as the target's fit: the request evidence, and the fusion where it is a
    # candidate source (its usage vectors out of fold, as the fit scores them)
    request = scorer.request.inputs(steps, res) if scorer.request else None
    fusion = None
    if scorer.zero.candidates:
        usage = scorer.usage.inner(steps, gold, mem, q, vec, res.tool_index.vectors, folds,
                                   inner_seed(seed, 0))
        zero = torch.from_numpy(
            scorer.zero.scores(steps, usage.numpy(), res, scorer.query_rendering))  # [S, N]

        def fusion(held: torch.Tensor, _vec: torch.Tensor) -> torch.Tensor:
            return zero[held].to(_vec.device)
    data = inner_fold_candidates(steps, gold, mem, vec, scorer.keys, scorer.m, scorer.eps, res.registry.names,
                                 res.device, folds, inner_seed(seed, 0), fusion=fusion, request=request)
    data.fold = data.fold + fold_offset
    return data


def fit_transfer_model(scorer: TracerPlusScorer, sources: Sequence[tuple[Sequence[Trajectory], Resources]],
                       seed: int = 0) -> tuple[CandidateModel, dict]:
    """Train one candidate model on the pooled out-of-fold candidates of ``sources`` ((trajectories,
    resources) per dataset), with the scorer's model kind and training settings; early stopping
    holds out the last inner fold of the last source. Returns ``(model, history)``."""
    parts, offset = [], 0
    for trajectories, res in sources:
        parts.append(source_candidates(scorer, trajectories, res, offset))
        offset = int(parts[-1].fold.max()) + 1 if len(parts[-1]) else offset
    cfg = scorer.head_cfg
    return train_model(CandidateData.cat(parts), scorer.model_kind, int(cfg["hidden"]),
                       scorer.train_config(seed), keep=scorer.keep, refit=bool(cfg["refit"]),
                       members=scorer.members)
