"""Per-fold encoders for evaluation: each outer fold's scorer sees an encoder fine-tuned on that fold's
training trajectories only, so no held-out step ever reached the encoder's training pairs.

``Evaluator(..., fold_resources=FoldEncoders(registry, cfg))`` calls it once per outer fold with the
fold's training trajectories; it fine-tunes (or finds the cached checkpoint) and returns fresh
:class:`Resources` whose embedder, tool index and hence memories, queries and tool vectors all use it.
With ``serve_as`` the fold's checkpoint is served through another embedder built from it (a model2vec
static model distilled from it, an ONNX export): the fast encoders, trained.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracer.build import build_embedder, load_config, plain
from tracer.core.context import ContextRendering
from tracer.core.types import Registry, Trajectory
from tracer.encode.source import DEFAULT_CACHE
from tracer.learn.encoder import TrainConfig, finetuned, train_info
from tracer.learn.pairs import Pairs, training_pairs
from tracer.learn.static_encoder import trained_static
from tracer.scoring.resources import Resources


def beside_teacher(query: Mapping[str, Any], teacher: str | Path) -> dict[str, Any]:
    """The embedder config of a ``fixed_tools`` query encoder (``query``: its config, e.g. ONNX int8 of the
    checkpoint) served beside its ``teacher`` checkpoint, which embeds the tool texts in torch as it did when the
    query encoder was trained (``configs/embedder/finetuned.yaml``); one embedding cache around both."""
    tools = plain(load_config("embedder", "finetuned")) | {"model": str(teacher)}
    return {"_target_": "tracer.encode.dual.DualEmbedder",
            **{side: {k: v for k, v in c.items() if k != "cache_dir"} for side, c in (("query", query), ("tools", tools))}}


class FoldEncoders:
    """Builds one fold's :class:`Resources` around an encoder fine-tuned on that fold's training data.

    Args:
        registry: the dataset's registry (tool texts are its ``search_text``).
        cfg: ``configs/encoder_training/*.yaml``: ``context`` (anchor rendering), ``successful_only``,
            ``base_model``, ``encoder_dir``, ``device``, ``inner_encoders`` (one more encoder per inner fold of
            tracer_plus's candidate model, trained without that fold: no step it is fitted on reached its
            encoder; 5x the training; a static query encoder's inner tables keep the outer fold's teacher), ``kind`` (``transformer``, or ``static``: a model2vec token table
            trained on the pairs, :mod:`tracer.learn.static_encoder`, with ``pca_dims``), ``negatives``
            (``in_batch``; ``registry``: each context ranked against every registry tool, static only; ``trie``: one
            hard negative per pair, another child of its trie state, transformer only,
            :func:`tracer.learn.pairs.trie_negatives`),
            ``context_weight`` (weight of a context-to-context in-batch loss beside the context-to-tool one,
            :func:`tracer.learn.static_encoder.train_static`, ``TrainConfig.context_weight``), ``layers`` (transformer only: the
            base model's layers kept, a shallower student; ``ffn``, its feed-forward width, a narrower one; ``distill``, its distillation from the full-depth
            encoder; ``fixed_tools``, a query encoder trained against the full-depth encoder's frozen vectors of
            the registry, served as a :class:`tracer.encode.dual.DualEmbedder` whose tool side is that encoder
            (as ``finetuned.yaml``; with kind ``static`` the query side is a token table, ``pca_dims`` null and
            ``teacher`` the TrainConfig fields of that encoder, ``static_query.yaml``); ``from_teacher``, a student cut from that encoder;
            :class:`TrainConfig`), ``serve_as`` (the embedder config, ``_target_`` and arguments, that
            serves a checkpoint, completed with ``model=<checkpoint folder>``: ``encoder_training=mnrl_static``
            serves it as a ``StaticEmbedder``; absent: sentence-transformers, ``configs/embedder/finetuned.yaml``;
            the embedder keeps its config, so an index saved with it loads it again), ``slow`` (a second recipe,
            trained on the same trajectories and returned as the resources' ``slow``: a cascade's second stage,
            :class:`tracer.scorers.cascade.CascadeScorer`; ``encoder_training/cascade.yaml``) and the
            :class:`TrainConfig` fields.
        embed_cache: the embedding cache directory (the checkpoint's hash names its vectors there).
        device, seed, executor: as :meth:`Resources.build`.
        log: called with each training step's loss and learning rate, or None (the curve is in ``history``).
    """

    def __init__(self, registry: Registry, cfg: Mapping[str, Any], embed_cache: str | Path | None = ".cache/embeddings",
                 device: str | None = None, seed: int = 0, executor: Any = None,
                 log: Callable[[dict], None] | None = None):
        cfg = dict(cfg)
        self.registry = registry
        self.rendering = ContextRendering.from_config(cfg.pop("context", None))
        self.successful_only = bool(cfg.pop("successful_only", True))
        self.base_model = cfg.pop("base_model", None)
        self.encoder_dir = cfg.pop("encoder_dir", DEFAULT_CACHE)
        self.train_device = cfg.pop("device", None)
        self.inner_encoders = bool(cfg.pop("inner_encoders", False))
        self.kind = cfg.pop("kind", "transformer")  # static: train a model2vec token table instead
        pca_dims = cfg.pop("pca_dims", 256)
        self.pca_dims = None if pca_dims is None else int(pca_dims)
        teacher = cfg.pop("teacher", None)  # a static query encoder's teacher: TrainConfig fields (mnrl.yaml's)
        self.negatives = cfg.pop("negatives", "in_batch")
        self.context_weight = float(cfg.pop("context_weight", 0.0))
        if self.kind not in ("transformer", "static"):
            raise ValueError(f"encoder_training.kind must be transformer or static, got {self.kind!r}")
        if (self.negatives not in ("in_batch", "registry", "trie") or (self.negatives == "registry" and self.kind != "static")
                or (self.negatives == "trie" and self.kind != "transformer")):
            raise ValueError(f"encoder_training.negatives must be in_batch, registry with kind static (a transformer "
                             f"would re-encode every tool text each batch) or trie with kind transformer, got "
                             f"{self.negatives!r} with kind {self.kind!r}")
        if self.context_weight < 0:
            raise ValueError(f"encoder_training.context_weight must be >= 0, got {self.context_weight}")
        serve_as = cfg.pop("serve_as", None)
        slow = cfg.pop("slow", None)  # a cascade's second stage: another recipe, trained on the same trajectories
        # a transformer's recipe carries the weight (its key); the static trainer takes it beside its recipe
        self.recipe = TrainConfig(**cfg, **({"context_weight": self.context_weight} if self.kind == "transformer" else {}))
        if self.recipe.student and self.kind != "transformer":
            raise ValueError(f"encoder_training.layers and ffn cut a transformer's depth and width; kind {self.kind!r} "
                             f"has no layers")
        if self.recipe.fixed_tools and self.negatives != "in_batch":
            raise ValueError(f"encoder_training.fixed_tools ranks each context against every registry tool, so it "
                             f"takes negatives in_batch (no hard negatives to add), got {self.negatives!r}")
        static_query = self.kind == "static" and self.recipe.fixed_tools
        if static_query and (teacher is None or self.pca_dims is not None):
            raise ValueError(f"encoder_training: a static query encoder (kind static, fixed_tools) needs teacher (the "
                             f"TrainConfig fields of the transformer whose tool vectors it is ranked against, "
                             f"mnrl.yaml's) and pca_dims null (the teacher's width); got teacher {teacher}, "
                             f"pca_dims {self.pca_dims}")
        if teacher is not None and not static_query:
            raise ValueError("encoder_training.teacher names a static query encoder's teacher (kind static, "
                             "fixed_tools); a transformer student's teacher is its own recipe at full size")
        self.teacher = TrainConfig(**teacher) if static_query else None
        self.embed_cache, self.device, self.seed, self.executor, self.log = embed_cache, device, seed, executor, log
        self.serve_as = dict(serve_as) if serve_as is not None else plain(load_config("embedder", "finetuned"))
        self.history: list[dict] = []  # per call: checkpoint, training time, the trajectories the pairs came from
        if slow is not None and not isinstance(slow, Mapping):
            raise ValueError(f"encoder_training.slow must be a recipe (a mapping, e.g. '- mnrl_int8@slow' in a "
                             f"defaults list), got {slow!r}")
        if slow is not None and "slow" in slow:
            raise ValueError("encoder_training.slow.slow: a cascade has two stages, its slow recipe has no slow stage")
        self.slow = (FoldEncoders(registry, slow, embed_cache, device, seed, executor, log)
                     if slow is not None else None)

    def pairs(self, train: Sequence[Trajectory]) -> Pairs:
        return training_pairs(train, self.registry, self.rendering, self.successful_only,
                              "trie" if self.negatives == "trie" else "in_batch", self.recipe.seed)

    def checkpoint(self, pairs: Pairs, log: Callable[[dict], None] | None = None,
                   teacher: str | Path | None = None) -> Path:
        """The encoder trained on ``pairs`` by this recipe (its folder): trained on a miss, found in the cache on a
        hit. ``log``: as the constructor's (default: it). ``teacher``: a static query encoder's teacher to rank
        against instead of the one fine-tuned on ``pairs`` (an inner fold's table beside its outer fold's teacher)."""
        log = log or self.log
        # the registry's tool texts, for the recipes that rank each context against all of them
        tools = [t.search_text for t in self.registry] if self.negatives == "registry" or self.recipe.fixed_tools else None
        if self.kind == "static":
            if self.teacher is not None and teacher is None:
                teacher = finetuned(pairs, self.teacher, self.base_model, self.encoder_dir, self.train_device, log)
            return trained_static(pairs, self.recipe, self.base_model, self.pca_dims, self.encoder_dir, log,
                                  tools, self.context_weight, teacher)
        return finetuned(pairs, self.recipe, self.base_model, self.encoder_dir, self.train_device, log, tools)

    def __call__(self, train: Sequence[Trajectory], inner_of: int | None = None,
                 held: frozenset[str] = frozenset()) -> Resources:
        """Resources around the encoder fine-tuned on ``train``. With ``inner_encoders``, their ``without(groups)``
        fine-tunes (or finds) an encoder on ``train`` minus those groups, for a scorer's inner folds
        (``inner_of``: the index in ``history`` of the outer call it serves; ``held``: the groups left out)."""
        pairs = self.pairs(train)
        # a static query encoder's inner tables are trained without their fold beside the outer fold's teacher: its
        # one vector per tool cannot hold a context, and a teacher per inner fold would be 5x the fine-tuning
        shared = self.history[inner_of]["teacher"] if inner_of is not None and self.teacher is not None else None
        path = self.checkpoint(pairs, teacher=shared)
        serve = {"_target_": "tracer.encode.static.StaticEmbedder", "pca_dims": self.pca_dims,
                 "encoder_dir": str(self.encoder_dir)} if self.kind == "static" else self.serve_as
        info = train_info(path)
        config = {**serve, "model": str(path)}
        if self.recipe.fixed_tools:
            config = beside_teacher(config, info["teacher"])
        embedder = build_embedder(config, cache_dir=self.embed_cache)
        served = embedder.inner
        # a student's own time leaves out its teacher's (trained first, or found), which its cost includes
        teacher = info.get("teacher")
        self.history.append({"checkpoint": str(path), "pairs": len(pairs), "train_seconds": info["train_seconds"],
                             "teacher": teacher,
                             "teacher_train_seconds": train_info(teacher)["train_seconds"] if teacher else None,
                             "final_loss": info["loss"][-1], "loss": info["loss"], "served_as": served.name,
                             "inner_of": inner_of, "held_groups": sorted(held),
                             "trajectory_ids": sorted(set(pairs.trajectory_ids))})
        res = Resources.build(self.registry, embedder, device=self.device, seed=self.seed, executor=self.executor)
        if self.slow is not None and inner_of is None:  # inner folds fit the fast stage only
            res.slow = self.slow(train)
            self.history[-1]["slow"] = {k: v for k, v in self.slow.history[-1].items() if k != "trajectory_ids"}
        if self.inner_encoders and inner_of is None:
            outer = len(self.history) - 1
            res.without = lambda groups: self([t for t in train if t.group not in groups], outer, groups)
        return res

    @property
    def outer(self) -> list[dict]:
        """The history of the outer folds' encoders (the inner folds' left out), one per outer fold."""
        return [h for h in self.history if h["inner_of"] is None]
