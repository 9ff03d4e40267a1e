"""Usage-enriched tool vectors (Tool2Vec): a tool's description vector plus the contexts of the logged steps
that called it.

Moon et al. (2024), *Efficient and Scalable Estimation of Tool Representations in Vector Space*
(arXiv:2409.02141), represent a tool by the mean embedding of the queries that used it: a query phrased as
users phrase it lands near the tools such queries called, however the tools' descriptions read. A tool never
called has no usage, so here the description is the prior the usage is added to:

    u_t = normalise(prior * e_t + sum_{s calls t} c_s)

with ``e_t`` the embedded tool text (a row of the FAISS index) and ``c_s`` the embedded context of each logged
step that called ``t``; a tool's score is the query's cosine with ``u_t``, and a tool never called keeps its
vector search score exactly. Over an approximate index only the tools it retrieved are rescored (a called
tool it did not retrieve stays ``-inf``): the ranking still covers what the index returned, no registry sort.
At ``prior = 1`` the description weighs as much as one call whose context points its way; contexts that agree
add up, so a tool called a hundred times from like requests is placed by them.

The one definition for :mod:`tracer.scorers.tool2vec` (the ranking alone) and tracer_plus's zero-shot fusion
(``zero_shot.usage``: its vector input once the logs have calls, :mod:`tracer.scorers.tracer_plus.zero_shot`).
"""

from __future__ import annotations

import numpy as np
import torch


def check_prior(prior: float, name: str) -> float:
    if not prior > 0:
        raise ValueError(f"{name}: the usage prior must be > 0 (the description's weight), got {prior}")
    return float(prior)


def context_sums(ctx: torch.Tensor, called: torch.Tensor, n: int) -> torch.Tensor:
    """``[N, d]`` float64: the sum of the contexts ``ctx [S, d]`` by the tool each step called (``called
    [S]`` registry ids); 0 for a tool never called."""
    total = torch.zeros(n, ctx.shape[1], dtype=torch.float64)
    return total.index_add_(0, called.cpu(), ctx.detach().cpu().double())


def usage_vectors(tools: np.ndarray, sums: np.ndarray, prior: float) -> tuple[np.ndarray, np.ndarray]:
    """``(called [K] int64, u [K, d] float64)``: the tools with usage (a nonzero sum) and their unit vectors
    ``normalise(prior * tools[t] + sums[t])``, from the description rows ``tools [N, d]`` and the context sums
    ``sums [N, d]``."""
    sums = np.asarray(sums, dtype=np.float64)
    called = np.flatnonzero(np.abs(sums).sum(1) > 0)
    u = prior * np.asarray(tools, dtype=np.float64)[called] + sums[called]               # [K, d]
    return called, u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12)


def usage_scores(vec: torch.Tensor, query: torch.Tensor, called: np.ndarray, u: np.ndarray) -> torch.Tensor:
    """``[B, N]`` float32: :func:`usage_scores_one` over a batch, ``vec [B, N]`` and ``query [B, d]``
    (returned on ``vec``'s device)."""
    out = usage_scores_one(vec.detach().cpu().numpy(), query.detach().cpu().numpy(), called, u)
    return torch.from_numpy(out).to(vec.device)


def usage_scores_one(vec: np.ndarray, query: np.ndarray, called: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The vector scores ``vec [..., N]`` float32 with the called tools' finite entries replaced by the
    queries' ``[..., d]`` cosines with their usage vectors (float64 products rounded to float32): one live
    step (``[N]``, ``[d]``) or a batch; numpy, the one definition of both paths."""
    out = np.array(vec, dtype=np.float32)
    if len(called):
        use = (np.asarray(query, dtype=np.float64) @ u.T).astype(np.float32)             # [..., K]
        was = out[..., called]
        out[..., called] = np.where(np.isfinite(was), use, was)
    return out
