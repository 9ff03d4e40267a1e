"""Candidates and features of ``tracer_plus``: the union of several keys' children and the vector top m.

At a step, every configured state key (:class:`tracer.memory.trie.StateKey`) maps the calls so far to a
state ``S_j`` in its own execution trie, and the vector index ranks the registry by the cosine of
the query context with each tool. The candidate set is

    cand = (children of S_1) ∪ ... ∪ (children of S_K) ∪ (top m of the vector ranking)

sorted by registry id. Every candidate ``t`` gets one feature row (``F`` numbers): per key ``j``
(named ``<key label>.<feature>``, e.g. ``prefix.log_p``, ``last_1+cross_turn.member``):

============== ============================================================= ===========================
feature        meaning                                                       outside S_j's children
============== ============================================================= ===========================
member         1 if t is a child of S_j                                      0
log_p          empirical prior log(N(S_j,t)/N(S_j) + eps)                    0
log_r          contextual prior log(relu(cos)/sum relu(cos) + eps) over      0
               S_j's children (the trie's ``log_l``)
edge_cos       raw cosine of the memory context with the edge memory         0
               m_{S_j,t}
log_visits     log(1 + N(S_j)) (state level; 0 for an unseen state)          the state's value
log_children   log(1 + number of children of S_j) (state level)              the state's value
member*v       member x log_visits, member x log_children                     0
log_p*v ...    log_p, log_r and edge_cos each x log_visits and x log_children 0
============== ============================================================= ===========================

The neutral values of a candidate outside ``S_j``'s children (``NEUTRAL``) are all 0, so every
product is 0 too; ``member`` = 0 tells the model that the zeros mean "not proposed by this key"
(for a linear scorer the constant chosen does not matter: the weight of ``member`` absorbs it).
State-level features are equal for every candidate of a step, so alone they cannot reorder the
candidates under a softmax; they act through their products (how far to trust this key's
proposal and priors at a well-visited or a wide state) and through the MLP.

Global features, defined for every candidate:

- ``vector`` group: ``vec_cos`` (cosine of the query context with the tool's name and
  description), ``vec_rank`` (log of the 1-based rank in the vector ranking of the whole
  registry, ties by registry position) and ``vec_top`` (1 if that rank is at most m, i.e. the
  vector search proposed it).
- ``tool`` group: ``tool_log_freq`` = log(1 + number of training steps that called t) and
  ``tool_cos`` = cosine of the memory context with the tool memory (the normalised mean context
  of every training step that called t, whatever its state: the edge memory of an empty state;
  0 for a tool never called).
- ``history`` group: ``hist_count`` = log(1 + times t was called earlier in the conversation),
  ``in_turn`` = 1 if t was called earlier in this turn, ``is_last`` = 1 if t is the previous call.

With ``zero_shot.candidates`` (:mod:`tracer.scorers.tracer_plus.zero_shot`) the zero-shot fusion's top m
join the candidates too, and a ``fusion`` group closes each row: ``zs_score`` (the fused score), ``zs_rank``
(log of the 1-based rank in the fusion) and ``zs_top`` (1 if that rank is at most m).

With ``request`` (:mod:`tracer.scorers.tracer_plus.request`) the request's best BM25 matches join the
candidates too, and a ``request`` group closes each row: ``req_bm25``, ``req_top``, ``req_name`` and
``never_called`` (what the request asks, from its own words, and whether the logs hold any evidence).

Feature groups (for ``features.drop``): ``member``, ``log_p``, ``log_r``, ``edge_cos``,
``state`` (log_visits, log_children and every product with them), ``vector``, ``tool``, ``history``,
``fusion`` and ``request``; a product belongs to both factors' groups and goes when either is dropped.

Arithmetic (one definition for the batched path, torch on any device, and the single-step path,
numpy on the CPU): priors and cosines come from :meth:`ExecutionTrie.gather` /
:func:`tracer.scoring.single_step.children_one` (bit-identical), the state features and log ranks from float32
tables built once, products are float32 x float32 (one IEEE rounding in both paths), so the raw
feature rows agree bit for bit (the two cosine tables are float64 matrix-vector products rounded
to float32, as the trie's similarities).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tracer.core.types import Step
from tracer.learn import standardise
from tracer.memory.keys import StateKey
from tracer.scorers.tracer_plus.index import PlusIndex
from tracer.scorers.tracer_plus.request import REQUEST_FEATURES, SEMANTIC_FEATURES, RequestInput

KEY_FEATURES = ("member", "log_p", "log_r", "edge_cos", "log_visits", "log_children",
                "member*log_visits", "member*log_children", "log_p*log_visits", "log_p*log_children",
                "log_r*log_visits", "log_r*log_children", "edge_cos*log_visits", "edge_cos*log_children")
VECTOR_FEATURES = ("vec_cos", "vec_rank", "vec_top")
TOOL_FEATURES = ("tool_log_freq", "tool_cos")
HISTORY_FEATURES = ("hist_count", "in_turn", "is_last")
GLOBAL_FEATURES = VECTOR_FEATURES + TOOL_FEATURES + HISTORY_FEATURES
# the zero-shot fusion's score, log rank and top-m flag (zero_shot.candidates: after the global features)
FUSION_FEATURES = ("zs_score", "zs_rank", "zs_top")
GROUPS = ("member", "log_p", "log_r", "edge_cos", "state", "vector", "tool", "history", "fusion", "request")
NEUTRAL = {"member": 0.0, "log_p": 0.0, "log_r": 0.0, "edge_cos": 0.0}
_STATE = ("log_visits", "log_children")


def feature_names(keys: Sequence[StateKey], fusion: bool = False,
                  request: Sequence[str] = ()) -> tuple[str, ...]:
    """Every column's name: the keys', the global ones, the fusion's, then ``request``'s (the request
    evidence's columns, :attr:`tracer.scorers.tracer_plus.request.RequestEvidence.features`)."""
    return (tuple(f"{k.label}.{f}" for k in keys for f in KEY_FEATURES) + GLOBAL_FEATURES
            + (FUSION_FEATURES if fusion else ()) + tuple(request))


def feature_groups(name: str) -> set[str]:
    """The groups a feature belongs to (``features.drop`` removes a feature when any of them is dropped)."""
    base = name.rsplit(".", 1)[-1]
    for group, names in (("vector", VECTOR_FEATURES), ("tool", TOOL_FEATURES), ("history", HISTORY_FEATURES),
                         ("fusion", FUSION_FEATURES), ("request", REQUEST_FEATURES + SEMANTIC_FEATURES)):
        if base in names:
            return {group}
    return {"state" if part in _STATE else part for part in base.split("*")}


def keep_mask(names: Sequence[str], drop: Sequence[str]) -> torch.Tensor:
    """``[F]`` 1 for a feature in use, 0 for one dropped by group (``GROUPS``) or by its full name."""
    return standardise.keep_mask(names, drop, GROUPS, feature_groups)


def n_features(n_keys: int, fusion: bool = False, n_request: int = 0) -> int:
    """F: the width of a feature row with ``n_keys`` keys (and the fusion's and ``n_request`` request
    features)."""
    fused = len(FUSION_FEATURES) if fusion else 0
    return n_keys * len(KEY_FEATURES) + len(GLOBAL_FEATURES) + fused + n_request


@dataclass
class Candidates:
    """Candidate sets of B steps, padded to the widest one (C)."""

    tool: torch.Tensor      # [B, C] registry ids, ascending (0 where masked)
    mask: torch.Tensor      # [B, C] True for a real candidate
    feats: torch.Tensor     # [B, C, F] raw features (float32; 0 where masked)
    in_state: torch.Tensor  # [B, K] key j's state has children
    depth: torch.Tensor     # [B] length of the first key's state (-1 when unseen)

    def gold_index(self, gold_ids: torch.Tensor, ignore: int = -100) -> torch.Tensor:
        """Position of each step's gold id ``[B]`` among its candidates, ``ignore`` where it is not one."""
        gold_ids = gold_ids.to(self.tool.device)
        hit = self.mask & (self.tool == gold_ids[:, None])                               # [B, C]
        return torch.where(hit.any(1), hit.float().argmax(1), torch.full_like(gold_ids, ignore))


def coverage(registry, steps: Sequence[Step], tool: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` 1.0 if the step's gold is a candidate, 0.0 if not, -1.0 if unknown."""
    gold = torch.tensor([registry.id(s.gold) if s.gold in registry else -1 for s in steps], dtype=torch.long)
    hit = (mask.cpu() & (tool.cpu() == gold[:, None])).any(1).float()
    return torch.where(gold >= 0, hit, -1.0)


def _history_counts(idx: PlusIndex, steps: Sequence[Step], n: int, device) -> tuple[torch.Tensor, ...]:
    """``[B, N]`` float32: times each tool was called so far, 1 if called this turn, 1 if the previous
    call."""
    count = torch.zeros(len(steps), n + 1, dtype=torch.float32)
    turn = torch.zeros(len(steps), n + 1, dtype=torch.float32)
    last = torch.zeros(len(steps), n + 1, dtype=torch.float32)
    for i, s in enumerate(steps):
        for name in s.history:
            count[i, idx.tool_id.get(name, n)] += 1
        for name in s.prefix:
            turn[i, idx.tool_id.get(name, n)] = 1
        if s.history:
            last[i, idx.tool_id.get(s.history[-1], n)] = 1
    return tuple(x[:, :n].to(device) for x in (torch.log1p(count.double()).float(), turn, last))


def _ranks(scores: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` 1-based ranks of ``scores [B, N]``: a stable descending sort, ties by registry position (as
    :func:`tracer.scoring.ranking.rank`)."""
    b, n = scores.shape
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices               # [B, N]
    ones = torch.arange(1, n + 1, device=scores.device).expand(b, n)
    return torch.empty_like(order).scatter_(1, order, ones)


def candidates(idx: PlusIndex, steps: Sequence[Step], mem_ctx: torch.Tensor, vec: torch.Tensor,
               m: int, zs: torch.Tensor | None = None, req: RequestInput | None = None) -> Candidates:
    """Candidates and raw features of a batch (see the module docstring).

    Args:
        idx: the tries (one per key; the trie's ``key`` maps a step to its state) and tables.
        steps: B steps.
        mem_ctx: ``[B, d]`` contexts under the memory rendering (edge and tool cosines).
        vec: ``[B, N]`` float32 vector scores of the registry under the query rendering.
        m: how many of the vector ranking's top tools join the candidates.
        zs: ``[B, N]`` the zero-shot fusion's scores (``zero_shot.candidates``): its top m join the candidates
            too, and its score, log rank and top-m flag are three more features; None: neither.
        req: the steps' request evidence (``request``): its top BM25 matches join the candidates and its
            features close each row (:meth:`RequestInput.rows`); None: neither.
    """
    tries, tables = idx.tries, idx.tables
    device = tries[0].device if tries else vec.device
    vec = vec.to(device)
    b, n = vec.shape
    cbs = [t.gather(t.lookup(steps), mem_ctx) for t in tries]
    rank = _ranks(vec)                                                                    # [B, N]
    zs = zs.to(device) if zs is not None else None                                        # [B, N]
    zrank = _ranks(zs) if zs is not None else None                                        # [B, N]
    is_cand = torch.zeros(b, n + 1, dtype=torch.bool, device=device)                     # column n: dump
    for cb in cbs:
        is_cand.scatter_(1, torch.where(cb.mask, cb.tool, n), True)
    is_cand = is_cand[:, :n]
    if m > 0:
        is_cand |= rank <= m
        if zrank is not None:
            is_cand |= zrank <= m
    if req is not None:
        is_cand |= torch.from_numpy(req.top).to(device)
    n_cand = is_cand.sum(1)                                                               # [B]
    width = max(int(n_cand.max()) if b else 0, 1)
    # candidate ids ascending: a stable sort puts the True columns first, in registry order
    tool = torch.sort((~is_cand).to(torch.uint8), dim=1, stable=True).indices[:, :width]  # [B, C]
    mask = torch.arange(width, device=device)[None, :] < n_cand[:, None]                # [B, C]
    tool = torch.where(mask, tool, 0)
    # tool -> column (width: dump)
    pos = torch.full((b, n + 1), width, dtype=torch.long, device=device)
    pos.scatter_(1, torch.where(mask, tool, n), torch.arange(width, device=device).expand(b, width).clone())
    # [B, C+1, F], dump column
    n_request = len(req.features) if req is not None else 0
    feats = torch.zeros(b, width + 1, n_features(len(tries), zs is not None, n_request),
                        dtype=torch.float32, device=device)
    rows = torch.arange(b, device=device)[:, None]
    in_state = torch.zeros(b, len(tries), dtype=torch.bool, device=device)
    zero = torch.zeros(b, device=device)
    for j, (cb, tab) in enumerate(zip(cbs, tables)):
        base = j * len(KEY_FEATURES)
        seen = cb.node >= 0
        safe = cb.node.clamp_min(0)
        lv = torch.where(seen, tab.log_visits[safe], 0.0) if len(tab.log_visits) else zero      # [B]
        lc = torch.where(seen, tab.log_children[safe], 0.0) if len(tab.log_children) else zero  # [B]
        in_state[:, j] = cb.mask.any(1)
        col = pos.gather(1, torch.where(cb.mask, cb.tool, n))                             # [B, Ck]
        # member, log_p, log_r, edge_cos; then visits, children and the products: one [B, Ck, 14] block,
        # laid out as in candidates_one
        v = torch.stack([torch.where(cb.mask, x.float(), 0.0) for x in (cb.mask.float(), cb.log_p, cb.log_l,
                                                                       cb.sim)], -1)    # [B, Ck, 4]
        block = torch.empty(*v.shape[:2], len(KEY_FEATURES), dtype=torch.float32, device=device)
        block[..., :4] = v
        block[..., 4], block[..., 5] = lv[:, None], lc[:, None]
        block[..., 6::2] = v * lv[:, None, None]
        block[..., 7::2] = v * lc[:, None, None]
        feats[rows, col, base:base + len(KEY_FEATURES)] = block
        feats[:, :, base + 4] = lv[:, None]                                               # non-members too
        feats[:, :, base + 5] = lc[:, None]
    feats = feats[:, :width]
    g = len(tries) * len(KEY_FEATURES)
    cand_rank = rank.gather(1, tool)                                                      # [B, C]
    feats[:, :, g] = vec.gather(1, tool)
    feats[:, :, g + 1] = torch.from_numpy(idx.log_ranks).to(device)[cand_rank - 1]
    feats[:, :, g + 2] = (cand_rank <= m).float()
    feats[:, :, g + 3] = idx.tool_log_freq.to(device)[tool]
    tool_cos = mem_ctx.to(device, torch.float64) @ idx.tool_memory.to(device, torch.float64).T  # [B, N]
    feats[:, :, g + 4] = tool_cos.float().gather(1, tool)
    for f, h in enumerate(_history_counts(idx, steps, n, device)):
        feats[:, :, g + 5 + f] = h.gather(1, tool)
    if zrank is not None:
        z_rank = zrank.gather(1, tool)                                                    # [B, C]
        feats[:, :, g + 8] = zs.gather(1, tool)
        feats[:, :, g + 9] = torch.from_numpy(idx.log_ranks).to(device)[z_rank - 1]
        feats[:, :, g + 10] = (z_rank <= m).float()
    if req is not None:  # one step at a time, as the live path (RequestInput.rows)
        r0 = g + 8 + (len(FUSION_FEATURES) if zrank is not None else 0)
        never = idx.tool_log_freq_np == 0                                                 # [N]
        tool_np, n_np = tool.cpu().numpy(), n_cand.cpu().numpy()
        block = np.zeros((b, width, len(req.features)), dtype=np.float32)                # [B, C, R]
        for i in range(b):
            block[i, :n_np[i]] = req.rows(i, tool_np[i, :n_np[i]], never)
        feats[:, :, r0:] = torch.from_numpy(block).to(device)
    feats = torch.where(mask[:, :, None], feats, 0.0)
    depth = cbs[0].depth if cbs else torch.full((b,), -1, dtype=torch.long, device=device)
    return Candidates(tool=tool, mask=mask, feats=feats, in_state=in_state, depth=depth)
