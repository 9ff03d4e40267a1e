"""Per-fold encoders: each outer fold's scorer sees an encoder trained on that fold's training trajectories
only, so no held-out step ever reached the encoder's training pairs.

``Evaluator(..., fold_resources=FoldEncoders(registry, recipe, build_embedder))`` calls it once per outer fold
with the fold's training trajectories; it trains (or finds the cached checkpoint) and returns fresh
:class:`Resources` whose embedder, tool index and hence memories, queries and tool vectors all use it.
``tracer.build.build_fold_encoders`` builds one from a recipe of ``tracer/configs/encoder_training/``;
``Retriever.from_dataset(encoder_training=...)`` runs one on a whole dataset.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracer.core.types import Registry, Trajectory
from tracer.encode.embedders import CachedEmbedder, recorded_tool_text
from tracer.encode.source import model_folder
from tracer.learn.encoders.pairs import Pairs, training_pairs
from tracer.learn.encoders.recipe import EncoderRecipe
from tracer.learn.encoders.static import trained_static
from tracer.learn.encoders.transformer import finetuned, train_info
from tracer.scorer_base.resources import Resources


class FoldEncoders:
    """Builds one fold's :class:`Resources` around an encoder trained on that fold's training data.

    Args:
        registry: the dataset's registry. Its tools are read as the recipe's base model reads them (its
            recorded ``tool_text``, :func:`~tracer.encode.embedders.recorded_tool_text`; MiniLM: name and
            description), in the training pairs and, recorded in each checkpoint, in serving.
        recipe: what to train and how to serve it (:class:`EncoderRecipe`,
            ``configs/encoder_training/*.yaml``).
        build_embedder: builds the embedder that serves a checkpoint, called as ``build_embedder(config,
            model=...)`` with the recipe's :meth:`EncoderRecipe.served` (``tracer.build.build_embedder`` with
            the run's embedding cache; the embedder keeps its config, so an index saved with it loads it
            again).
        device, seed, executor: as :meth:`Resources.build`.
        log: called with each training step's loss and learning rate, or None (the curve is in ``history``).
    """

    def __init__(self, registry: Registry, recipe: EncoderRecipe,
                 build_embedder: Callable[..., CachedEmbedder], device: str | None = None, seed: int = 0,
                 executor: Any = None, log: Callable[[dict], None] | None = None):
        self.registry, self.recipe, self.build_embedder = registry, recipe, build_embedder
        self.device, self.seed, self.executor, self.log = device, seed, executor, log
        # per call: checkpoint, training time, the trajectories the pairs came from
        self.history: list[dict] = []
        self.tool_text = (recorded_tool_text(model_folder(recipe.base_model)) if recipe.kind == "transformer"
                          else "name_description")
        self.slow = (FoldEncoders(registry, recipe.slow, build_embedder, device, seed, executor, log)
                     if recipe.slow is not None else None)

    def pairs(self, train: Sequence[Trajectory]) -> Pairs:
        return training_pairs(train, self.registry, self.recipe.context, self.recipe.successful_only,
                              self.tool_text)

    def checkpoint(self, pairs: Pairs, log: Callable[[dict], None] | None = None) -> Path:
        """The encoder trained on ``pairs`` by this recipe (its folder): trained on a miss, found in the cache
        on a hit. ``log``: as the constructor's (default: it)."""
        r, log = self.recipe, log or self.log
        if r.kind == "static":
            return trained_static(pairs, r.train, r.base_model, r.pca_dims, r.encoder_dir, log)
        # recorded only where it is not the default: MiniLM-based checkpoints keep their files
        record = {"tool_text": self.tool_text} if self.tool_text != "name_description" else None
        return finetuned(pairs, r.train, r.base_model, r.encoder_dir, r.device, log, record)

    def __call__(self, train: Sequence[Trajectory], inner_of: int | None = None,
                 held: frozenset[str] = frozenset()) -> Resources:
        """Resources around the encoder trained on ``train``. With ``inner_encoders``, their
        ``without(groups)`` trains (or finds) an encoder on ``train`` minus those groups, for a scorer's inner
        folds (``inner_of``: the index in ``history`` of the outer call it serves; ``held``: the groups left
        out)."""
        pairs = self.pairs(train)
        t0 = time.perf_counter()
        path = self.checkpoint(pairs)
        seconds = time.perf_counter() - t0  # this call's: near 0 when the checkpoint was found in the cache
        config, arguments = self.recipe.served(str(path))
        embedder = self.build_embedder(config, **arguments)
        info = train_info(path)
        # a student's own time leaves out its teacher's (trained first, or found), which its cost includes
        teacher = info.get("teacher")
        self.history.append({
            "checkpoint": str(path), "pairs": len(pairs), "train_seconds": info["train_seconds"],
            "seconds": seconds,
            "teacher": teacher,
            "teacher_train_seconds": train_info(teacher)["train_seconds"] if teacher else None,
            "final_loss": info["loss"][-1] if info["loss"] else None, "loss": info["loss"],
            "served_as": embedder.inner.name,
            "inner_of": inner_of, "held_groups": sorted(held),
            "trajectory_ids": sorted(set(pairs.trajectory_ids))})
        res = Resources.build(self.registry, embedder, device=self.device, seed=self.seed,
                              executor=self.executor)
        if self.slow is not None and inner_of is None:  # inner folds fit the fast stage only
            res.slow = self.slow(train)
            self.history[-1]["slow"] = {k: v for k, v in self.slow.history[-1].items()
                                        if k != "trajectory_ids"}
        if self.recipe.inner_encoders and inner_of is None:
            outer = len(self.history) - 1
            res.without = InnerEncoders(self, tuple(train), outer)
        return res

    @property
    def outer(self) -> list[dict]:
        """The history of the outer folds' encoders (the inner folds' left out), one per outer fold."""
        return [h for h in self.history if h["inner_of"] is None]


class InnerEncoders:
    """``Resources.without`` of an outer fold's resources: ``without(groups)`` is the resources around an
    encoder trained on the fold's training trajectories minus those groups (found in the cache when trained
    before), so a scorer's inner fold is scored by an encoder that never saw it. Recorded in the encoders'
    history as an inner call of outer fold ``outer``."""

    def __init__(self, encoders: FoldEncoders, train: tuple[Trajectory, ...], outer: int):
        self.encoders, self.train, self.outer = encoders, train, outer

    def __call__(self, groups: frozenset[str]) -> Resources:
        return self.encoders([t for t in self.train if t.group not in groups], self.outer, groups)
