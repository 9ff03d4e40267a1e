"""tracer_plus's candidate model: a linear (or one-hidden-layer, or a mean of several) scorer over the
candidate features of :mod:`tracer.learn.candidate_features`, standardised by :mod:`tracer.learn.standardise`,
with its file format. Its training is :mod:`tracer.learn.candidate_fit` (as the blend head's is
:mod:`tracer.learn.blend_fit`).

Example::

    model = CandidateModel(n_features, "mlp", hidden=32, members=10)
    scores = model.scores(cand.feats, cand.mask)                      # [B, C], -inf where masked
    save_candidate_model(model, names, "transfer.pt"); load_candidate_model("transfer.pt", names, "mlp")
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tracer.core.io import atomic_save
from tracer.learn.standardise import Z_CLIP, fit_stats, register_stats, standardise


# ---- the model -----------------------------------------------------------------------------------
def _mlp(n_features: int, hidden: int, gen: torch.Generator) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, 1, bias=False))
    for lin in (net[0], net[2]):
        nn.init.kaiming_uniform_(lin.weight, a=5 ** 0.5, generator=gen)
    nn.init.zeros_(net[0].bias)
    return net


class MlpEnsemble(nn.Module):
    """The mean score of ``M`` one-hidden-layer MLPs, each trained on its own (:func:`train_model`).

    Why: a single MLP's held-out recall moves with its initial weights (the candidate sets are small and
    the NLL has many near-equal minima); the members average that out, and on BFCL the mean of 10 kept
    more recall@5 than one MLP at about the same recall@1 (docs/encoders.md, "The candidate model"). They
    share one inner split, so its part of the spread stays. Scores are summed member by member in order,
    then divided by ``M``, in both inference paths, so they agree bit for bit."""

    def __init__(self, members: Sequence[nn.Sequential]):
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, z: torch.Tensor) -> torch.Tensor:                                  # z [..., F] -> [..., 1]
        total = self.members[0](z)
        for net in self.members[1:]:
            total = total + net(z)
        return total / len(self.members)


class CandidateModel(nn.Module):
    """Scores candidates from their standardised features.

    Args:
        n_features: F.
        kind: ``linear`` (``s = w . z``, weights start at 0: every candidate equal) or ``mlp``
            (``s = w2 . relu(W1 z + b1)``, ``hidden`` units, seeded init).
        hidden: MLP width.
        keep: ``[F]`` 1 for a feature in use, 0 for a dropped one (zeroed after standardising).
        seed: seeds the MLP's initial weights (member ``i`` of an ensemble: ``seed + i``).
        members: M > 1 (``mlp`` only): the mean of M MLPs (:class:`MlpEnsemble`). The linear model's fit
            is convex and starts from zero, so its members would all be the same model.

    ``forward(z [P, F] standardised rows of the real candidates) -> [P]`` scores.
    """

    def __init__(self, n_features: int, kind: str = "linear", hidden: int = 32, keep: torch.Tensor | None = None,
                 seed: int = 0, members: int = 1):
        super().__init__()
        if kind not in ("linear", "mlp"):
            raise ValueError(f"model must be linear or mlp, got {kind!r}")
        if members < 1 or (members > 1 and kind != "mlp"):
            raise ValueError(f"head.members must be 1, or more with model: mlp (got {members} with {kind!r}): "
                             "the linear fit is convex and starts at zero, so every member would be the same")
        self.kind, self.hidden, self.members = kind, hidden, int(members)
        if kind == "linear":
            self.net = nn.Linear(n_features, 1, bias=False)
            nn.init.zeros_(self.net.weight)
        elif members == 1:
            self.net = _mlp(n_features, hidden, torch.Generator().manual_seed(seed))
        else:
            self.net = MlpEnsemble([_mlp(n_features, hidden, torch.Generator().manual_seed(seed + i))
                                    for i in range(members)])
        register_stats(self, n_features, keep)

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, torch.Tensor], kind: str, hidden: int, members: int = 1
                        ) -> CandidateModel:
        model = cls(int(sd["mean"].shape[0]), kind, hidden, members=members)
        model.load_state_dict(dict(sd))
        return model

    @property
    def mlps(self) -> list[nn.Sequential]:
        """The MLP (one) or the ensemble's members, in order; [] for the linear model."""
        if self.kind == "linear":
            return []
        return list(self.net.members) if isinstance(self.net, MlpEnsemble) else [self.net]

    def set_feature_stats(self, rows: torch.Tensor) -> CandidateModel:
        """Standardise with the mean and SD (accumulated in float64) of the candidate rows ``[P, F]`` of
        the training split."""
        fit_stats(self, rows, accumulate=torch.float64)
        return self

    def standardise(self, feats: torch.Tensor) -> torch.Tensor:
        """Raw features ``[..., F]`` -> standardised, dropped features zeroed, clipped (dtype of ``feats``)."""
        return standardise(feats, self.mean, self.std, self.keep)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).squeeze(-1)

    # inference in float64 (both paths), rounded to float32 -----------------------------------
    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        self.__dict__.pop("_inf", None)  # drop the float64 copies of the old weights
        return super().load_state_dict(state_dict, strict, assign)

    def _inference(self) -> dict:
        """Float64 copies of the buffers and weights (torch and numpy), made once per set of weights."""
        inf = self.__dict__.get("_inf")
        if inf is None:
            net64 = copy.deepcopy(self.net).double().eval()
            inf = {"net": net64, "mean": self.mean.double(), "std": self.std.double(), "keep": self.keep.double(),
                   "np": [p.detach().cpu().numpy() for p in net64.parameters()]}
            if self.kind == "mlp":  # per member (W1 [H, F], b1 [H], w2 [1, H]), in order
                inf["mlps"] = [[p.detach().cpu().numpy() for p in m.parameters()] for m in
                               (net64.members if isinstance(net64, MlpEnsemble) else [net64])]
            inf.update({f"{b}_np": inf[b].cpu().numpy() for b in ("mean", "std", "keep")})
            self.__dict__["_inf"] = inf
        return inf

    @torch.no_grad()
    def scores(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, C]`` float32 (-inf where masked) from raw features ``[B, C, F]``, computed in float64."""
        inf = self._inference()
        mean, std, keep = (inf[b].to(feats.device) for b in ("mean", "std", "keep"))
        z = standardise(feats.double(), mean, std, keep)                                # [B, C, F]
        s = inf["net"].to(feats.device)(z).squeeze(-1).float()                          # [B, C]
        return s.masked_fill(~mask, float("-inf"))

    def scores_one(self, feats: np.ndarray) -> np.ndarray:
        """:meth:`scores` for one step's candidates ``[C, F]`` (numpy, float64 inside) -> ``[C]`` float32."""
        inf = self._inference()
        z = np.clip((feats.astype(np.float64) - inf["mean_np"]) / inf["std_np"] * inf["keep_np"], -Z_CLIP, Z_CLIP)
        if self.kind == "linear":                                                        # np: [weight [1, F]]
            return (z @ inf["np"][0][0]).astype(np.float32)
        total = None
        for w1, b1, w2 in inf["mlps"]:                                                   # as MlpEnsemble.forward
            s = np.maximum(z @ w1.T + b1, 0.0) @ w2[0]                                   # [C, H] -> [C]
            total = s if total is None else total + s
        return (total if len(inf["mlps"]) == 1 else total / len(inf["mlps"])).astype(np.float32)


def save_candidate_model(model: CandidateModel, names: Sequence[str], path: str | Path) -> Path:
    """Write a candidate model with its feature names (for ``transfer``), atomically."""
    return atomic_save({"features": list(names), "kind": model.kind, "hidden": model.hidden,
                        "members": model.members, "state_dict": model.state_dict()}, path)


def load_candidate_model(path: str | Path, names: Sequence[str], kind: str) -> CandidateModel:
    """Read :func:`save_candidate_model`'s file; other feature names (keys, feature set) or another
    model kind are refused."""
    obj = torch.load(path, weights_only=True)
    if list(obj["features"]) != list(names) or obj["kind"] != kind:
        raise ValueError(f"{path}: a {obj['kind']} model on features {obj['features']}; this scorer is {kind} on "
                         f"{list(names)}")
    return CandidateModel.from_state_dict(obj["state_dict"], obj["kind"], int(obj["hidden"]),
                                          int(obj.get("members", 1))).eval()
