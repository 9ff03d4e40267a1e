"""The two priors of an edge S->t: empirical (counts) and contextual (cosines with the edge memories)."""

from __future__ import annotations

import numpy as np
import torch

_NEG_INF = float("-inf")


def empirical_prior(count: torch.Tensor, node_count: torch.Tensor, eps: float) -> torch.Tensor:
    """P = log(N(S,t)/N(S) + eps) per edge, computed in float64, stored float32."""
    return torch.log(count.double() / node_count.double().clamp_min(1) + eps).float()


def empirical_prior_np(count: np.ndarray, node_count: np.ndarray, eps: float) -> np.ndarray:
    """:func:`empirical_prior` in numpy (an online update's few touched edges, without torch dispatch): the
    same IEEE float64 division and sum; the log is numpy's, which matched torch's on every value rounded
    to float32 that we compared (counts up to 500; BFCL's priors in ``tests/integration/online``)."""
    return np.log(count / np.maximum(node_count, 1) + eps).astype(np.float32)  # int / int is float64 in numpy


def contextual_prior(sim: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """L = log(relu(sim) / sum_children relu(sim) + eps), uniform over the children if every sim <= 0.

    ``sim [B, C]``, ``mask [B, C]`` -> ``[B, C]`` float32 with -inf where masked (float64 inside).
    """
    pos = sim.double().clamp_min(0).masked_fill_(~mask, 0.0)            # [B, C] relu, 0 where masked
    total = pos.sum(1, keepdim=True)                                    # [B, 1]
    uniform = mask.double() / mask.sum(1, keepdim=True).clamp_min(1)    # [B, C] 1/n over the children
    prob = torch.where(total > 0, pos / total, uniform)                 # 0/0 rows are replaced by uniform
    return torch.log(prob.add_(eps)).float().masked_fill_(~mask, _NEG_INF)
