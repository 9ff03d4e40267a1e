"""The per-state blend head: w and T for every decision step (the model; its fit is in
:mod:`tracer.learn.blend_fit`).

At a step whose state S has children t (empirical prior P, contextual prior L, see
:mod:`tracer.memory.trie`) the head predicts a blend weight ``w in (0, 1)`` and a temperature ``T > 0``
from five state features and scores each child

    s(t) = (w P(t) + (1 - w) L(t)) / T.

State features (``FEATURES``, standardised by :mod:`tracer.learn.standardise` with the training
split's mean and SD, stored in the head's buffers). Each says how far one of the two priors can be
trusted at this state:

- ``log_visits`` = log(1 + N(S)): how much evidence the counts rest on. A node seen twice has a
  noisy P; a node seen a thousand times has a sharp, reliable P.
- ``depth`` = length of the state (turn-local prefix): deep prefixes are rarer and more
  task-specific, shallow ones (the turn opening) are where the user's request, i.e. the context,
  decides most.
- ``log_children`` = log(1 + number of children): how wide the choice is; with many children
  the counts spread thin and the context has more to separate.
- ``entropy_p`` = H(P) / log(#children) (0 with one child): normalised entropy of the empirical
  prior. A peaked P (one dominant continuation) deserves weight; a flat P says nothing.
- ``entropy_l`` = H(L) / log(#children): normalised entropy of the contextual prior. A peaked L
  means the context matches one edge memory much better than the others; a flat L means the
  context does not discriminate.

Heads: two linear maps over the standardised features, ``w = m + (1 - 2m) sigmoid(a.z + b)``
(``m = 1e-4`` keeps w strictly inside (0, 1) even when the sigmoid saturates) and
``T = t_floor + softplus(c.z + d)`` (T >= t_floor > 0, so 1/T is finite). Standardised features
are clipped to +-8 SD so that an out-of-range state cannot blow up either head. Weights start at
zero and the biases at w = 0.5, T = 0.5, i.e. exactly the fixed blend s = P + L of
``tracer_fixed``: training starts from the baseline and moves only where the data says so.

The loss (:func:`tracer.learn.nll.masked_nll`) is the NLL of the gold child under ``log_softmax`` of
``s`` over the node's children; steps whose gold is not a child carry no gradient.

References: DPR (Karpukhin et al., 2020), ``BiEncoderNllLoss``; the TRACER paper's learned blend
(Tables 13 and 14: predicted w/T per environment and the w head's coefficients).

Example::

    cb = trie.gather(trie.lookup(steps), contexts)
    scores, _, _ = head(cb.log_p, cb.log_l, cb.mask, state_features(cb))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tracer.learn.nll import IGNORE, masked_nll
from tracer.learn.standardise import fit_stats, register_stats, standardise
from tracer.memory.trie import ChildBatch

__all__ = ["FEATURES", "IGNORE", "BlendHead", "fixed_blend", "state_features"]

FEATURES = ("log_visits", "depth", "log_children", "entropy_p", "entropy_l")
_W_MARGIN = 1e-4       # w in [m, 1 - m]


# ---- features ------------------------------------------------------------------------------------
def _normalised_entropy(prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """H(prob) / log(#children) per row, ``[B, C] -> [B]``; 0 for rows with fewer than two children."""
    prob = torch.where(mask, prob, torch.zeros_like(prob))
    prob = prob / prob.sum(1, keepdim=True).clamp_min(1e-30)
    h = -torch.where(prob > 0, prob * torch.log(prob.clamp_min(1e-30)), torch.zeros_like(prob)).sum(1)
    n = mask.sum(1).to(prob.dtype)
    return torch.where(n > 1, h / torch.log(n.clamp_min(2)), torch.zeros_like(h))


def state_features(cb: ChildBatch) -> torch.Tensor:
    """The five state features (``FEATURES``) of a child batch, raw (not standardised): ``[B, 5]``."""
    dtype = cb.log_p.dtype if cb.log_p.is_floating_point() else torch.float32
    mask = cb.mask
    n_child = mask.sum(1).to(dtype)                                                      # [B]
    visits = torch.log1p(cb.node_count.to(dtype))                                        # [B]
    depth = cb.depth.clamp_min(0).to(dtype)                                              # [B]
    p = cb.count.to(dtype) / cb.node_count.clamp_min(1).to(dtype)[:, None]               # [B, C]
    q = torch.exp(torch.where(mask, cb.log_l, torch.zeros_like(cb.log_l)))               # [B, C]
    return torch.stack([visits, depth, torch.log1p(n_child), _normalised_entropy(p, mask),
                        _normalised_entropy(q, mask)], dim=1)                            # [B, 5]


# ---- the head ------------------------------------------------------------------------------------
class BlendHead(nn.Module):
    """Per-step blend weight w and temperature T from standardised state features.

    Args:
        n_features: input width (5, ``FEATURES``).
        t_floor: lower bound of T (T = t_floor + softplus(.)), so 1/T <= 1/t_floor.
        keep: ``[n_features]`` 1 for a feature in use, 0 for one dropped (ablation); a dropped
            feature is zeroed after standardisation.

    Inputs of :meth:`forward`: ``log_p, log_l [B, C]`` (-inf where masked), ``mask [B, C]``,
    ``feats [B, F]`` raw features, optional ``gold [B]`` child index (``IGNORE`` where the gold is
    not a child). Returns ``(scores [B, C] with -inf where masked, loss or None, n_correct or None)``.
    """

    def __init__(self, n_features: int, t_floor: float, keep: torch.Tensor | None = None):
        super().__init__()
        if not t_floor > 0:
            raise ValueError(f"t_floor must be > 0, got {t_floor}")
        self.w_head = nn.Linear(n_features, 1)
        self.t_head = nn.Linear(n_features, 1)
        t0 = max(0.5 - t_floor, 0.05)  # start at T = 0.5 (the fixed blend) when the floor allows
        with torch.no_grad():
            self.w_head.weight.zero_()
            self.w_head.bias.zero_()
            self.t_head.weight.zero_()
            self.t_head.bias.fill_(math.log(math.expm1(t0)))  # softplus^-1(t0)
        register_stats(self, n_features, keep)
        self.register_buffer("t_floor", torch.tensor(float(t_floor)))

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, torch.Tensor]) -> BlendHead:
        head = cls(int(sd["w_head.weight"].shape[1]), float(sd["t_floor"]))
        head.load_state_dict(dict(sd))
        return head

    def set_feature_stats(self, feats: torch.Tensor) -> BlendHead:
        """Standardise with the mean and SD of ``feats [S, F]`` (the training split's rows)."""
        fit_stats(self, feats)
        return self

    def standardise(self, feats: torch.Tensor) -> torch.Tensor:
        return standardise(feats.to(self.mean.dtype), self.mean, self.std, self.keep)     # [B, F]

    def wt(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w [B] in (0, 1), T [B] >= t_floor)`` for raw features ``[B, F]``."""
        z = self.standardise(feats)
        w = _W_MARGIN + (1 - 2 * _W_MARGIN) * torch.sigmoid(self.w_head(z).squeeze(-1))
        t = self.t_floor + F.softplus(self.t_head(z).squeeze(-1))
        return w, t

    @staticmethod
    def blend(log_p: torch.Tensor, log_l: torch.Tensor, mask: torch.Tensor, w: torch.Tensor,
              t: torch.Tensor) -> torch.Tensor:
        """s = (w P + (1 - w) L) / T per child, ``[B, C]``, 0 on the padding (mask it before use)."""
        # zero the padding before multiplying: w * -inf would put NaN into the gradient of w
        p = log_p.to(w.dtype).masked_fill(~mask, 0.0)                                    # [B, C]
        lc = log_l.to(w.dtype).masked_fill(~mask, 0.0)                                   # [B, C]
        return (w[:, None] * p + (1 - w[:, None]) * lc) / t[:, None]

    def forward(self, log_p: torch.Tensor, log_l: torch.Tensor, mask: torch.Tensor, feats: torch.Tensor,
                gold: torch.Tensor | None = None):
        w, t = self.wt(feats)                                                            # [B], [B]
        s = self.blend(log_p, log_l, mask, w, t)                                         # [B, C]
        scores = s.masked_fill(~mask, float("-inf"))
        if gold is None:
            return scores, None, None
        loss, n_correct = masked_nll(s, mask, gold)
        return scores, loss, n_correct

    def coefficients(self, names: Sequence[str] = FEATURES) -> dict[str, dict[str, float]]:
        """Fitted coefficients over standardised features (the paper's Table 14 for w), plus T's."""
        out = {}
        for head_name, lin in (("w", self.w_head), ("T", self.t_head)):
            coef = {n: float(c) for n, c in zip(names, lin.weight.detach().cpu()[0])}
            coef["bias"] = float(lin.bias.detach().cpu()[0])
            out[head_name] = coef
        return out

    def feature_stats(self, names: Sequence[str] = FEATURES) -> dict[str, Any]:
        return {"features": list(names), "mean": self.mean.cpu().tolist(), "std": self.std.cpu().tolist(),
                "keep": self.keep.cpu().tolist(), "t_floor": float(self.t_floor)}


def fixed_blend(log_p: torch.Tensor, log_l: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """tracer_fixed's scores s = P + L (w = 0.5, T = 0.5), ``[B, C]`` with -inf where masked."""
    return torch.where(mask, log_p + log_l, torch.full_like(log_p, float("-inf")))
