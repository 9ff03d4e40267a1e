"""One training loop for every learned model: Adam on ``loss + weight_decay * sum(weights^2)``
(biases are not penalised), early-stopped on a validation loss, seeded and deterministic on CPU.

The model supplies two closures: ``batch_loss(idx)`` the training loss on the training rows
``idx`` (``None``: all of them, full batch) and ``val_loss()`` the ``(loss, n_correct)`` of the
validation rows (:func:`tracer.learn.nll.masked_nll`'s shape). Every epoch runs the training
batches in a seeded order (mini-batch) or one full batch, then evaluates; the best epoch's weights
are kept and training stops after ``patience`` epochs without improvement. Without ``val_loss``
the loop runs ``max_epochs`` epochs and keeps the last weights (refitting for a known epoch count).

Run it inside :func:`tracer.core.threads.one_thread` (the callers do, around their whole fit): one
thread fixes the order of the reductions, so the same seed gives the same weights.

Example::

    cfg = TrainConfig(lr=0.05, weight_decay=1e-3, max_epochs=500, patience=50, batch_size=0, seed=0)
    history = train(model, lambda idx: masked_nll(model(x), mask, gold)[0],
                    lambda: masked_nll(model(x_val), mask_val, gold_val), n_train, n_val, cfg)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and stopping settings; the values come from the caller's config (no defaults here).

    lr: Adam's learning rate. weight_decay: strength of the l2 penalty on the weights (not the biases).
    max_epochs, patience: stop when the validation loss has not improved for ``patience`` epochs.
    batch_size: 0 for full batch, else mini-batches in a seeded order. seed: seeds that order.
    """

    lr: float
    weight_decay: float
    max_epochs: int
    patience: int
    batch_size: int
    seed: int

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], **given: Any) -> TrainConfig:
        """The fields from ``cfg`` (other keys ignored), ``given`` taking precedence; a missing one is
        named."""
        values = {f.name: given[f.name] if f.name in given else cfg.get(f.name) for f in fields(cls)}
        missing = [k for k, v in values.items() if v is None]
        if missing:
            raise ValueError(f"training config lacks {missing} (has {sorted(cfg)})")
        return cls(float(values["lr"]), float(values["weight_decay"]), int(values["max_epochs"]),
                   int(values["patience"]), int(values["batch_size"]), int(values["seed"]))


class EarlyStopping:
    """Keeps the best validation loss, its epoch and a copy of the weights at it, and the loss curves.

    ``step(...)`` returns True once ``patience`` epochs passed without an improvement of more than
    ``min_delta``; ``restore()`` puts the best weights back into the model.
    """

    def __init__(self, model: nn.Module, patience: int, min_delta: float = 1e-7):
        self.model, self.patience, self.min_delta = model, patience, min_delta
        self.best, self.best_epoch, self.bad = float("inf"), 0, 0
        self.state = copy.deepcopy(model.state_dict())
        self.curves: dict[str, list[float]] = {"train_loss": [], "val_loss": [], "val_acc": []}

    def step(self, epoch: int, train_loss: float, val_loss: float, val_acc: float) -> bool:
        self.curves["train_loss"].append(train_loss)
        self.curves["val_loss"].append(val_loss)
        self.curves["val_acc"].append(val_acc)
        if val_loss < self.best - self.min_delta:
            self.best, self.best_epoch, self.bad = val_loss, epoch, 0
            self.state = copy.deepcopy(self.model.state_dict())
            return False
        self.bad += 1
        return self.bad >= self.patience

    def restore(self) -> None:
        self.model.load_state_dict(self.state)

    @property
    def epochs(self) -> int:
        return len(self.curves["val_loss"])


def weight_penalty(model: nn.Module) -> torch.Tensor:
    """Sum of squared weights (biases excluded), for the l2 term."""
    return sum(p.pow(2).sum() for n, p in model.named_parameters() if n.endswith("weight"))


def train(model: nn.Module, batch_loss: Callable[[torch.Tensor | None], torch.Tensor],
          val_loss: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None, n_train: int, n_val: int,
          cfg: TrainConfig, device: torch.device | str | None = None) -> dict[str, Any]:
    """Fit ``model`` in place (see the module docstring) and return its history.

    ``n_train``: training rows (the mini-batch order permutes them; the epoch's training loss is the
    row-weighted mean over batches). ``n_val``: validation rows with a gold candidate (the
    denominator of ``val_acc``). Returns ``{"train_loss", "val_loss", "val_acc": per-epoch lists,
    "best_epoch", "best_val_loss", "epochs"}``; without ``val_loss`` only ``train_loss`` and ``epochs``.
    """
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    stopper = EarlyStopping(model, cfg.patience) if val_loss is not None else None
    train_curve: list[float] = []
    for epoch in range(cfg.max_epochs):
        model.train()
        order = torch.randperm(n_train, generator=gen) if cfg.batch_size else None
        chunks = order.split(cfg.batch_size) if order is not None else [None]
        ep_loss = 0.0
        for idx in chunks:
            idx = idx.to(device) if idx is not None and device is not None else idx
            loss = batch_loss(idx)
            opt.zero_grad()
            (loss + cfg.weight_decay * weight_penalty(model)).backward()
            opt.step()
            ep_loss += float(loss.detach()) * (len(idx) if idx is not None else n_train)
        if stopper is None:
            train_curve.append(ep_loss / max(n_train, 1))
            continue
        model.eval()
        with torch.no_grad():
            vloss, vcorrect = val_loss()
        if stopper.step(epoch, ep_loss / max(n_train, 1), float(vloss), int(vcorrect) / max(n_val, 1)):
            break
    if stopper is None:
        return {"train_loss": train_curve, "epochs": cfg.max_epochs}
    stopper.restore()
    return {**stopper.curves, "best_epoch": stopper.best_epoch, "best_val_loss": stopper.best,
            "epochs": stopper.epochs}
