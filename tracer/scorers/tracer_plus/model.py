"""tracer_plus's candidate model: a linear (or one-hidden-layer, or a mean of several) scorer over the
candidate features of :mod:`tracer.scorers.tracer_plus.features`, standardised by
:mod:`tracer.learn.standardise`, with its file format. Its training is :mod:`tracer.scorers.tracer_plus.fit`
(as the blend head's is :mod:`tracer.learn.blend_fit`).

Example::

    model = CandidateModel(n_features, "mlp", hidden=32, members=10)
    scores = model.scores(cand.feats, cand.mask)                      # [B, C], -inf where masked
    save_candidate_model(model, names, "transfer.pt");
    load_candidate_model("transfer.pt", names, "mlp", 32, 10)
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

_BLOCK = 1 << 24  # float64 numbers in one block of scores' hidden layer (128 MiB): rows per block follow


# ---- the model -----------------------------------------------------------------------------------
def check_model(kind: str, members: int = 1) -> None:
    """Refuse a model kind or member count :class:`CandidateModel` cannot build (before any work)."""
    if kind not in ("linear", "mlp"):
        raise ValueError(f"model must be linear or mlp, got {kind!r}")
    if members < 1 or (members > 1 and kind != "mlp"):
        raise ValueError(f"head.members must be 1, or more with model: mlp (got {members} with {kind!r}): "
                         "the linear fit is convex and starts at zero, so every member would be the same")


def _members(net: nn.Module) -> list[nn.Sequential]:
    """The MLPs of an ``mlp`` model's ``net``: its ensemble's members in order, or the one MLP."""
    return list(net.members) if isinstance(net, MlpEnsemble) else [net]


def _mlp(n_features: int, hidden: int, gen: torch.Generator) -> nn.Sequential:
    # drawn in float64, then rounded: uniform_'s scaling to the bound has vectorised kernels whose float32
    # results differ in the last bit between instruction sets (fit.py's _wide says why that matters)
    net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, 1, bias=False)).double()
    for lin in (net[0], net[2]):
        nn.init.kaiming_uniform_(lin.weight, a=5 ** 0.5, generator=gen)
    nn.init.zeros_(net[0].bias)
    return net.float()


class MlpEnsemble(nn.Module):
    """The mean score of ``M`` one-hidden-layer MLPs, each trained on its own (:func:`train_model`).

    Why: a single MLP's held-out recall moves with its initial weights (the candidate sets are small and
    the NLL has many near-equal minima); the members average that out, and on BFCL the mean of 10 kept
    more recall@5 than one MLP at about the same recall@1 (experiments/studies/inner_folds/README.md,
    "How much is the seed?"). They share one inner split, so its part of the spread stays. Training runs
    member by member (``forward``); scoring runs :meth:`CandidateModel.scores_one`, in float64 with the
    members stacked into one matrix, for a batch and a live step alike."""

    def __init__(self, members: Sequence[nn.Sequential]):
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # z [..., F] -> [..., 1]
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

    def __init__(self, n_features: int, kind: str = "linear", hidden: int = 32,
                 keep: torch.Tensor | None = None, seed: int = 0, members: int = 1):
        super().__init__()
        check_model(kind, members)
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

    @classmethod
    def mean_of(cls, models: Sequence[CandidateModel]) -> CandidateModel:
        """The ensemble of single MLPs trained on the same rows: their nets become its members, in order,
        and their (shared) standardisation its own."""
        first = models[0]
        if any(m.kind != "mlp" or m.members != 1 or not torch.equal(m.mean, first.mean)
               or not torch.equal(m.std, first.std) for m in models):
            raise ValueError("an ensemble is built from single MLPs with the same standardisation statistics")
        out = cls(len(first.mean), "mlp", first.hidden, first.keep, members=len(models))
        out.net = MlpEnsemble([m.net for m in models]) if len(models) > 1 else first.net
        with torch.no_grad():
            out.mean.copy_(first.mean)
            out.std.copy_(first.std)
        return out

    @property
    def mlps(self) -> list[nn.Sequential]:
        """The MLP (one) or the ensemble's members, in order; [] for the linear model."""
        return [] if self.kind == "linear" else _members(self.net)

    def set_feature_stats(self, rows: torch.Tensor) -> CandidateModel:
        """Standardise with the mean and SD (accumulated in float64) of the candidate rows ``[P, F]`` of
        the training split."""
        fit_stats(self, rows, accumulate=torch.float64)
        return self

    def standardise(self, feats: torch.Tensor) -> torch.Tensor:
        """Raw features ``[..., F]`` -> standardised, dropped features zeroed, clipped (dtype of
        ``feats``)."""
        return standardise(feats, self.mean, self.std, self.keep)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).squeeze(-1)

    # inference in float64 (one numpy definition for both paths), rounded to float32 ---------------
    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        self.__dict__.pop("_inf", None)  # drop the float64 copies of the old weights
        return super().load_state_dict(state_dict, strict, assign)

    def _inference(self) -> dict:
        """Float64 numpy copies of the buffers and weights, made once per set of weights."""
        inf = self.__dict__.get("_inf")
        if inf is None:
            net64 = copy.deepcopy(self.net).double().eval()
            inf = {f"{b}_np": getattr(self, b).detach().cpu().double().numpy()
                   for b in ("mean", "std", "keep")}
            if self.kind == "linear":
                inf["w"] = net64.weight.detach().cpu().numpy()[0]                       # [F]
                inf["width"] = len(inf["w"])
            else:  # the members stacked: W1 [M*H, F], b1 [M*H], w2 [M*H]
                mlps = _members(net64)
                inf["w1"], inf["b1"], inf["w2"] = (np.concatenate([p(m).detach().cpu().numpy() for m in mlps])
                                                   for p in (lambda m: m[0].weight, lambda m: m[0].bias,
                                                             lambda m: m[2].weight[0]))
                inf["members"], inf["width"] = len(mlps), len(inf["w2"])
            self.__dict__["_inf"] = inf
        return inf

    @torch.no_grad()
    def scores(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, C]`` float32 (-inf where masked) from raw features ``[B, C, F]``: :meth:`scores_one`
        (numpy, float64 inside) over blocks of rows, so a batch and a live step run the same arithmetic."""
        x = feats.detach().cpu().numpy()                                                # [B, C, F]
        rows = max(1, _BLOCK // max(1, x.shape[1] * self._inference()["width"]))      # steps per block
        s = np.zeros(x.shape[:2], dtype=np.float32)                                     # [B, C]
        for i in range(0, len(x), rows):
            s[i:i + rows] = self.scores_one(x[i:i + rows])
        return torch.from_numpy(s).to(feats.device).masked_fill(~mask, float("-inf"))

    def scores_one(self, feats: np.ndarray) -> np.ndarray:
        """Scores from raw features ``[..., F]`` (one step's candidates ``[C, F]``, or a block of steps) ->
        ``[...]`` float32: numpy, float64 inside; the one inference of both paths."""
        inf = self._inference()
        z = np.clip((feats.astype(np.float64) - inf["mean_np"]) / inf["std_np"] * inf["keep_np"],
                    -Z_CLIP, Z_CLIP)
        if self.kind == "linear":
            return (z @ inf["w"]).astype(np.float32)
        # [..., M*H]: every member at once
        h = np.maximum(z @ inf["w1"].T + inf["b1"], 0.0)
        # the sum over members / M
        return (h @ inf["w2"] / inf["members"]).astype(np.float32)


def save_candidate_model(model: CandidateModel, names: Sequence[str], path: str | Path) -> Path:
    """Write a candidate model with its feature names (for ``transfer``), atomically."""
    return atomic_save({"features": list(names), "kind": model.kind, "hidden": model.hidden,
                        "members": model.members, "state_dict": model.state_dict()}, path)


def load_candidate_model(path: str | Path, names: Sequence[str], kind: str, hidden: int, members: int = 1
                         ) -> CandidateModel:
    """Read :func:`save_candidate_model`'s file; other feature names (keys, feature set), another model kind,
    MLP width or member count are refused (the scorer saves its config beside these weights and rebuilds
    the model from it on load)."""
    obj = torch.load(path, weights_only=True)
    got = (obj["kind"], int(obj["hidden"]), int(obj.get("members", 1)))
    if (list(obj["features"]) != list(names)
            or (got[0] != kind or (kind == "mlp" and got[1:] != (hidden, members)))):
        raise ValueError(f"{path}: a {got[0]} model (hidden {got[1]}, members {got[2]}) on features "
                         f"{obj['features']}; this scorer is {kind} (hidden {hidden}, members {members}) "
                         f"on {list(names)}")
    return CandidateModel.from_state_dict(obj["state_dict"], *got).eval()
