"""Usage-enriched tool scores (Tool2Vec): a tool's description cosine blended with the cosine of the mean
context of the logged steps that called it, weighted by how often it was called.

Moon et al. (2024), *Efficient and Scalable Estimation of Tool Representations in Vector Space*
(arXiv:2409.02141), represent a tool by the mean embedding of the queries that used it: a query phrased as
users phrase it lands near the tools such queries called, however the tools' descriptions read. A tool never
called has no usage, so here the description is a prior worth ``prior`` calls:

    s_t = (prior * cos(q, e_t) + n_t * cos(q, u_t)) / (prior + n_t)

with ``e_t`` the embedded tool text, ``u_t`` the normalised mean context of the ``n_t`` logged steps that
called ``t`` and ``q`` the query context. With no call it is vector search's cosine; one call weighs as much
as the description at ``prior = 1``; a hundred leave the description a trace. The one definition of the blend
for :mod:`tracer.scorers.tool2vec` (the ranking alone) and tracer_plus's ``usage`` candidates and features.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

Array = TypeVar("Array")  # a float64 numpy array or torch tensor


def check_prior(prior: float, name: str) -> float:
    if not prior > 0:
        raise ValueError(f"{name}: the usage prior must be > 0 (the description's weight in calls), got {prior}")
    return float(prior)


def usage_weights(log_freq: np.ndarray) -> np.ndarray:
    """``n_t`` as float64 ``[N]`` from ``log(1 + n_t)`` (float32, as tracer_plus's index keeps it): computed
    once in numpy, so the batched and the single-step paths blend with the very same weights."""
    return np.expm1(np.asarray(log_freq, dtype=np.float64))


def blend(prior: float, vec: Array, weight: Array, usage_cos: Array) -> Array:
    """``s [..., N]`` from the description cosines ``vec [..., N]``, the usage weights ``weight [N]`` and the
    usage cosines ``usage_cos [..., N]``, all float64 (numpy or torch: element-wise IEEE operations, so both
    give the same bits); ``-inf`` where ``vec`` is (a tool an approximate index did not retrieve)."""
    return (prior * vec + weight * usage_cos) / (prior + weight)
