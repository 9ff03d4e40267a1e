"""The training data of tracer_plus's candidate model: every training step's candidates and features,
scored by tries built from the other inner folds only (:func:`tracer.learn.oof.out_of_fold`: no step scored
by an index that saw its own trajectory), and the view of a fine-tuned encoder that never saw them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tracer.core.types import Step
from tracer.learn.nll import IGNORE
from tracer.learn.oof import out_of_fold, pad_cat
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.resources import Resources, fallback_scores
from tracer.scorers.tracer_plus.features import candidates, feature_names
from tracer.scorers.tracer_plus.index import PlusIndex
from tracer.scorers.tracer_plus.request import RequestInput

# held rows [h] -> (memory contexts [S, d], vector scores [S, N]) of every step under an encoder that never
# saw them
FoldView = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, RequestInput | None]]


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
    ``approximate``: ``vec`` comes from an approximate tool index (``candidates(..., approximate=True)``).
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
        zs = None if fusion is None else fusion(held, v[held])                            # [h, N]
        req = None if evidence is None else evidence.take(held.tolist())
        held_steps = [steps[i] for i in held.tolist()]
        cand = candidates(idx, held_steps, mem[held.to(mem.device)], v[held], m, zs, req,
                          approximate=approximate)
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
