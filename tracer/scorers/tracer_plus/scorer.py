"""``tracer_plus``: a multi-key candidate union scored by a learned candidate model.

Beyond the paper (docs/method.md, "tracer_plus"). At a turn opening the paper's turn-local prefix is the root,
whose many children make its empirical prior nearly useless; the previous call across turns and the latest
user request say much more. So instead of one trie and a fixed blend:

1. *Candidates* (:mod:`tracer.scorers.tracer_plus.features`): the union of the children of the step's state
   under each configured key (one trie per key, all sharing the same embedded training contexts) and the
   top ``vector_candidates`` (m) tools of the vector ranking (of what an approximate tool index retrieves).
2. *Features* per candidate and key (membership, log P, log R, edge cosine, the state's visits and children,
   the vector cosine, log rank and top-m flag), standardised with the training split's statistics.
3. *Model*: linear (default), an MLP or the mean of several, trained (:mod:`.fit`) by softmax NLL of the gold
   over the candidates on inner folds by group.

Ranking: candidates by model score, then the rest of the registry in vector order (``pad``); no candidate:
the vector ranking. References: DPR (Karpukhin et al., 2020), the NLL over a candidate set; the TRACER paper,
the trie, its priors and edge memories; ToolNet (Liu et al., 2024), the previous-call key.

Example: ``scorer = build_scorer("tracer_plus"); scorer.fit(train_trajectories, res)``, then
``finalize(scorer.score(steps), k=5)`` (batched) or ``scorer.select_one(step, scorer.embed([step]), k=5)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from tracer.core.context import ContextRendering
from tracer.core.store import Verify
from tracer.core.types import Step, Trajectory
from tracer.learn.trainer import TrainConfig
from tracer.memory.keys import parse_key
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.ranking import confidence, scatter_primary
from tracer.scorer_base.records import Scores
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorers.tracer_plus.features import Candidates, candidates, coverage, feature_names, keep_mask
from tracer.scorers.tracer_plus.fit import fit_scorer
from tracer.scorers.tracer_plus.index import PlusIndex, refreshed
from tracer.scorers.tracer_plus.model import CandidateModel, check_model
from tracer.scorers.tracer_plus.own_logs import OwnLogs
from tracer.scorers.tracer_plus.persist import load_plus, save_plus
from tracer.scorers.tracer_plus.request import RequestEvidence, RequestInput
from tracer.scorers.tracer_plus.step import LiveStep
from tracer.scorers.tracer_plus.usage import UsageInput
from tracer.scorers.tracer_plus.zero_shot import ZeroShot


class TracerPlusScorer(LiveStep, OwnLogs, ScorerBase):
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
            ``hidden`` (MLP width), ``members`` (MLPs averaged, ``mlp`` only), ``seed`` (default: the
            resources' seed).
        transfer: path of a candidate model saved by :func:`save_candidate_model` (trained on other
            datasets): ``fit`` then builds the tries only and keeps these weights; zero trajectories
            are allowed (cold start). ``None``: train on the fitted trajectories.
        zero_shot: what a cold index serves, and the guard that serves it in the model's place when the
            inner folds rank it better (:mod:`tracer.scorers.tracer_plus.zero_shot`); None: vector, no guard.
        request: ``{candidates, bm25}``: what the request asks, from its own words, as candidates and features
            (:mod:`tracer.scorers.tracer_plus.request`); None: neither (an index saved before them).
    """

    can_save = True

    def __init__(self, *, name: str, keys: Sequence, vector_candidates: int, query_context: Mapping,
                 memory_context: Mapping, features: Mapping, model: str, eps: float, pad: bool,
                 successful_only: bool, head: Mapping, zero_shot: Mapping | None, request: Mapping | None,
                 transfer: str | None = None):
        self.name, self.pad, self.eps, self.successful_only = name, pad, eps, successful_only
        self.transfer = str(transfer) if transfer else None
        self.zero = ZeroShot.from_config(zero_shot)
        self.request = RequestEvidence.from_config(request)
        self.keys = tuple(parse_key(k) for k in keys)
        if not self.keys and vector_candidates <= 0:
            raise ValueError("tracer_plus needs at least one key or vector_candidates > 0")
        self.m = int(vector_candidates)
        self.query_rendering = ContextRendering.from_config(query_context)
        self.memory_rendering = ContextRendering.from_config(memory_context)
        self.rendering = self.memory_rendering  # the step's context as compared with the edge memories
        self.drop, self.model_kind, self.head_cfg = (tuple((features or {}).get("drop") or ()), model,
                                                     dict(head))
        self.feature_names = feature_names(self.keys, self.zero.candidates,
                                           self.request.features if self.request else ())
        self.keep = keep_mask(self.feature_names, self.drop)
        check_model(model, self.members)
        self.res: Resources | None = None
        self.index: PlusIndex | None = None
        self.model: CandidateModel | None = None
        self.history: dict = {}
        # [S, C] out-of-fold scores of the training candidates (-inf: masked) for a cascade's gate; not saved
        self.inner_scores: torch.Tensor | None = None
        self.usage = UsageInput(self.zero.usage)  # the zero-shot fusion's usage vectors (zero_shot.usage)

    # ---- fitting -----------------------------------------------------------------------------
    def embed(self, steps: Sequence[Step], res: Resources | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(memory contexts ``[B, d]``, query contexts ``[B, d]``); one encode when the renderings agree."""
        res = res or self.res
        mem = res.embed(steps, self.memory_rendering)
        q = mem if self.query_rendering == self.memory_rendering else res.embed(steps, self.query_rendering)
        return mem, q

    def fit(self, trajectories: Sequence[Trajectory], res: Resources) -> FitReport:
        """Tries and candidate model (:func:`tracer.scorers.tracer_plus.fit.fit_scorer`); the report holds the
        curves, the scorer their scalars (``history``)."""
        return fit_scorer(self, trajectories, res)

    @property
    def members(self) -> int:
        """MLPs in the candidate model's ensemble (``head.members``; 1: a single model)."""
        return int(self.head_cfg.get("members", 1))

    def train_config(self, seed: int) -> TrainConfig:  # full batch; seed: the MLP's initial weights
        return TrainConfig.from_config(self.head_cfg, batch_size=0, seed=seed)

    def attach(self, tries: Sequence[ExecutionTrie], res: Resources,
               touched: tuple | None = None) -> TracerPlusScorer:
        """``touched``: (nodes per trie, gold ids) after an online update of these very tries
        (:func:`refreshed`)."""
        if [t.key for t in tries] != list(self.keys):
            raise ValueError(f"tries have keys {[t.key.label for t in tries]}, "
                             f"this scorer {[k.label for k in self.keys]}")
        if any(t.n_tools != len(res.registry) for t in tries):
            raise ValueError(f"tries are not over the registry's {len(res.registry)} tools")
        self.res = res
        self.index = refreshed(self.index, tries, res.registry.names, res.embedder.dim, touched)
        self.usage.refresh(self)
        return self

    @property
    def tries(self) -> list[ExecutionTrie]:
        return self.index.tries if self.index is not None else []

    @property
    def cold(self) -> bool:
        """No logged call yet (a transferred model before any update): every step is ranked by the vector
        query alone. The transferred weights were learned where the trie features carry most of the signal;
        over vector candidates alone they reorder worse than the vector ranking (docs/learning.md)."""
        return not any(t.n_edges for t in self.tries)

    @property
    def zero_shot_only(self) -> bool:  # cold, or the guard found the zero-shot ranking better than the model
        return self.cold or self.history.get("serves") == "zero_shot"

    @property
    def open_slot_serves(self) -> bool:
        """The request's open parts claim a slot: ``request.open_slot`` on, and the fit found it does not
        lose recall on the logs (:func:`choose_open_slot`; an index fitted before the choice: on)."""
        return bool(self.request and self.request.open_slot and self.history.get("open_slot", True))

    @property
    def reserve_slots(self) -> int:
        """How many of the last slots the claimants may take: the novel slots', or one for the request's
        open parts alone."""
        return self.zero.slots if self.zero.novel else 1

    @property
    def never_called(self) -> np.ndarray:
        """``[N]`` bool: tools no training or logged step has called (no trie evidence)."""
        return self.index.tool_log_freq_np == 0

    def _check_fitted(self) -> None:
        if self.res is None or self.model is None:
            raise RuntimeError(f"scorer {self.name!r} is not fitted: call fit(trajectories, resources) "
                               "or load()")

    # ---- scoring (batched) -------------------------------------------------------------------
    def candidates(self, steps: Sequence[Step], mem: torch.Tensor, vec: torch.Tensor,
                   zs: torch.Tensor | None = None, req: RequestInput | None = None) -> Candidates:
        """The steps' candidates and features; ``req``: their request evidence, computed here when not
        given."""
        if req is None and self.request:
            req = self.request.inputs(steps, self.res)
        # over an approximate index, what it retrieved
        return candidates(self.index, list(steps), mem, vec, self.m, zs, req,
                          approximate=not self.res.tool_index.exact)

    def score_embedded(self, steps: Sequence[Step], mem: torch.Tensor,
                       query: torch.Tensor | None = None, serving: str | None = None) -> Scores:
        """Score steps whose contexts are embedded: ``mem [B, d]`` (memory rendering), ``query [B, d]``
        (query rendering; default ``mem``). ``serving``: rank as ``"model"`` or ``"zero_shot"`` would,
        whichever the guard chose (None: as it chose; a trial's other ranking, :meth:`trial_rankings`)."""
        self._check_fitted()
        query = mem if query is None else query
        zero_only = self.zero_shot_only if serving is None else (serving == "zero_shot" or self.cold)
        n = len(self.res.registry)
        vec = fallback_scores(self.res, query)                                  # [B, N]
        zero = (self.zero.scores(steps, self.usage.scores(vec, query, self).numpy(), self.res,
                                 self.query_rendering)
                if self.zero_shot_wanted or zero_only else None)                               # [B, N]
        req = self.request.inputs(steps, self.res) if self.request else None
        cand = self.candidates(steps, mem, vec, torch.from_numpy(zero) if self.zero.candidates else None, req)
        s = self.model.scores(cand.feats, cand.mask)                            # [B, C]
        has = cand.mask.any(1)                                                  # [B]
        reserve = None  # the reserved slots' claimants: the request's open parts', then the novel slots'
        if not zero_only:
            novel = None
            if self.zero.novel:  # never-called tools of the top j of the novel_from ranking
                source = self.zero.novel_scores(steps, vec.cpu().numpy(), zero, self.res,
                                                self.query_rendering,
                                                None if req is None else req.bm25)        # [B, N]
                novel = self.zero.reserve(source, self.never_called, steps, self.res.registry)
            reserve = req.reserve(novel) if req is not None and self.open_slot_serves else novel
        # zero_shot.gate on its own logs: a step whose state they do not know is ranked by the fusion, and
        # nothing is reserved there
        gated = ~cand.in_state[:, 0] if self.gates and not zero_only else torch.zeros_like(has)      # [B]
        if reserve is not None and bool(gated.any()):
            reserve = [() if g else r for g, r in zip(gated.tolist(), reserve)]
        return Scores(
            primary=scatter_primary(cand.tool, cand.mask, s, n).cpu(),
            fallback=torch.from_numpy(zero) if zero_only or self.gates else vec,
            fell_back=(~has | zero_only | gated).cpu(),
            diagnostics={"in_trie": cand.in_state.any(1).cpu(), "kappa": confidence(s).float().cpu(),
                         "depth": cand.depth.cpu(), "n_children": cand.mask.sum(1).cpu(),
                         "in_candidates": coverage(self.res.registry, steps, cand.tool, cand.mask)},
            reserve=reserve,
            reserve_slots=self.reserve_slots,
        )

    # ---- persistence -------------------------------------------------------------------------
    def config(self) -> dict:
        return {"name": self.name, "keys": [asdict(k) for k in self.keys], "vector_candidates": self.m,
                "query_context": asdict(self.query_rendering),
                "memory_context": asdict(self.memory_rendering),
                "features": {"drop": list(self.drop)}, "model": self.model_kind, "eps": self.eps,
                "pad": self.pad, "successful_only": self.successful_only, "head": dict(self.head_cfg),
                "transfer": self.transfer, "zero_shot": self.zero.config(),
                "request": self.request.config() if self.request else None}

    # ---- learning while serving (tracer.online) -------------------------------------------------------
    @property
    def learned_part(self) -> str | None:
        """What a refit learns again: the model, or with transferred weights only the guard's choice (a
        refit loads the same weights and asks the guard again over the logs so far)."""
        return None if self.transfer and not self.zero.guard else "model"

    def memory_tables(self) -> list[ExecutionTrie]:
        return list(self.tries)

    def memory_contexts(self, steps: Sequence[Step], res: Resources) -> torch.Tensor:
        return self.embed(steps, res)[0]                                               # [S, d]

    reattach = attach  # (tables, res, touched): the tries updated in place, and the entries they touched

    def adopt(self, fresh: TracerPlusScorer) -> None:  # a refit's model, with the scalars of its fit
        self.model, self.history = fresh.model, fresh.history

    def describe(self) -> dict:
        out = {"scorer": self.name, "keys": [k.label for k in self.keys], "vector_candidates": self.m,
               "model": self.model_kind, "features": list(self.feature_names), "dropped": list(self.drop),
               "serves": "zero_shot" if self.index is not None and self.zero_shot_only else "model"}
        if self.model is not None:
            out["fit"] = {k: v for k, v in self.history.items() if not isinstance(v, list)}
            if self.model_kind == "linear":
                out["weights"] = dict(zip(self.feature_names,
                                          self.model.net.weight.detach().cpu()[0].tolist()))
        return out

    def save(self, directory: str | Path) -> Path:
        """Write the index as a new snapshot of ``directory`` (:func:`.persist.save_plus`)."""
        return save_plus(self, directory)

    @classmethod
    def load(cls, directory: str | Path, embedder, device: str | None = None, verify: Verify = "sha256"
             ) -> TracerPlusScorer:
        """Load a saved index (:func:`.persist.load_plus`)."""
        return load_plus(cls, directory, embedder, device, verify)
