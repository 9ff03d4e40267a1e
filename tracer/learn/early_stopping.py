"""Early stopping on a validation loss, shared by the blend head and tracer_plus's candidate scorer."""

from __future__ import annotations

import copy

import torch


class EarlyStopping:
    """Keeps the best validation loss, the epoch and a copy of the weights at it, and the loss curves.

    ``step(...)`` returns True once ``patience`` epochs passed without an improvement of more than
    ``min_delta``; ``restore()`` puts the best weights back into the model.
    """

    def __init__(self, model: torch.nn.Module, patience: int, min_delta: float = 1e-7):
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
