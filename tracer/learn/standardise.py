"""One standardiser for every learned model: mean/SD buffers fitted on the training rows, a keep
mask for feature ablations, and clipping.

``z = clip((x - mean) / sd * keep, -clip, +clip)``: a dropped feature (keep 0) is a constant 0, and a
constant feature (SD below 1e-6) gets SD 1 so that it stays 0 instead of dividing by zero. Clipping
keeps an out-of-range state from blowing up a head at test time.

The buffers live on the model itself (``mean``, ``std``, ``keep``), so a saved state dict holds
them beside the weights under the same names as before this module existed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

Z_CLIP = 8.0  # standardised features are clipped to +- this many SD


def register_stats(module: nn.Module, n_features: int, keep: torch.Tensor | None = None) -> None:
    """Give ``module`` the buffers ``mean`` and ``std`` ``[F]`` (identity until fitted) and ``keep``
    ``[F]``."""
    module.register_buffer("mean", torch.zeros(n_features))
    module.register_buffer("std", torch.ones(n_features))
    module.register_buffer("keep", torch.ones(n_features) if keep is None else keep.detach().clone().float())


@torch.no_grad()
def fit_stats(module: nn.Module, rows: torch.Tensor, accumulate: torch.dtype | None = None) -> None:
    """Set ``module.mean``/``module.std`` to the mean and (biased) SD of ``rows [P, F]``.

    ``accumulate``: the dtype the statistics are computed in before rounding to the buffers' dtype
    (``None``: the rows' own). No rows: mean 0; fewer than two rows: SD 1.
    """
    x = rows if accumulate is None else rows.to(accumulate)
    mean, std = module.mean, module.std
    mean.copy_(x.mean(0).to(mean.dtype) if len(x) else torch.zeros_like(mean))
    sd = x.std(0, unbiased=False).to(std.dtype) if len(x) > 1 else torch.ones_like(std)
    std.copy_(torch.where(sd > 1e-6, sd, torch.ones_like(sd)))  # a constant feature stays 0


def standardise(feats: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, keep: torch.Tensor,
                clip: float = Z_CLIP) -> torch.Tensor:
    """Raw features ``[..., F]`` -> standardised, dropped features zeroed, clipped; in ``feats``' dtype."""
    mean, std, keep = (b.to(feats.dtype) for b in (mean, std, keep))
    return ((feats - mean) / std * keep).clamp(-clip, clip)


def keep_mask(names: Sequence[str], drop: Iterable[str | int], groups: Sequence[str] = (),
              groups_of: Callable[[str], set[str]] | None = None) -> torch.Tensor:
    """``[F]`` 1 for a feature in use, 0 for one dropped by its name, its index or one of its groups.

    ``groups``: the group names ``drop`` may use; ``groups_of(name)`` the groups a feature is in.
    An unknown entry is an error naming the known groups and features.
    """
    drop = list(drop)
    unknown = [d for d in drop if not isinstance(d, int) and d not in groups and d not in names]
    bad_index = [d for d in drop if isinstance(d, int) and not 0 <= d < len(names)]
    if unknown or bad_index:
        known = (f"groups: {', '.join(groups)} (or a full feature name)" if groups
                 else f"features: {', '.join(names)}")
        raise ValueError(f"unknown feature groups or names to drop {unknown + bad_index}; {known}")
    by_name = {names[d] if isinstance(d, int) else d for d in drop}
    return torch.tensor([0.0 if (n in by_name or (groups_of is not None and groups_of(n) & by_name)) else 1.0
                         for n in names])
