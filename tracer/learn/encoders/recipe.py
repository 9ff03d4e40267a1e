"""An encoder recipe, typed: one ``tracer/configs/encoder_training/*.yaml`` read into dataclasses and checked
here.

:meth:`EncoderRecipe.from_config` binds a recipe's keys to these fields (an unknown key is an error that names
it and lists the valid ones); ``__post_init__`` checks the values. Nothing is trained or built here: the
trainers (:mod:`tracer.learn.encoders.transformer`, :mod:`tracer.learn.encoders.static`) take a
:class:`TrainConfig`, and :class:`tracer.learn.encoders.fold.FoldEncoders` runs a recipe per fold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from tracer.core.context import ContextRendering
from tracer.encode.source import DEFAULT_CACHE

# the fields that enter a checkpoint's key only when set, so that the keys of full-size, one-term recipes stay
OPTIONAL_FIELDS = ("layers", "from_teacher", "context_weight")
KINDS = ("transformer", "static")
# scalar field types checked when a record is built (a YAML value of another type: an error naming the key)
SCALARS = {"int": (int,), "float": (int, float), "bool": (bool,), "int | None": (int, type(None))}


def check_types(record: Any) -> None:
    """Each scalar field of a dataclass ``record`` holds a value of its type (a bool is not an int here)."""
    for f in fields(record):
        kinds = SCALARS.get(str(f.type))
        if kinds is None:
            continue
        value = getattr(record, f.name)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ValueError(f"encoder_training.{f.name} must be {f.type}, got {value!r}")


@dataclass(frozen=True)
class TrainConfig:
    """How an encoder is trained (every field enters the checkpoint's cache key).

    Args:
        batch_size: pairs per batch (in-batch negatives: B - 1 per anchor).
        lr: AdamW peak learning rate; ``warmup`` is the fraction of steps it ramps up over (transformer only).
        weight_decay: AdamW weight decay (0, as sentence-transformers' trainer).
        epochs: passes over the pairs.
        scale: the losses' inverse temperature on cosine similarities.
        max_seq_length: tokens per text while training (a transformer checkpoint keeps its own for encoding).
        seed: batches, dropout and initial state.
        layers: the base model's transformer layers to keep, by index (``()``: all): a shallower student,
            fine-tuned as it is and saved with only those layers, so encoding costs about in proportion to the
            layers kept (:func:`tracer.learn.encoders.student.keep_layers`).
        from_teacher: cut the student (``layers``) from its teacher, this recipe at full size fine-tuned on
            the same pairs (:meth:`teacher`), instead of from the base model, then fine-tune as usual (layer
            reduction after fine-tuning, as sentence-transformers' model-distillation example builds its
            student).
        context_weight: the weight of a second in-batch term, context to context
            (:class:`tracer.learn.encoders.losses.ContextRanking`): tracer_plus compares a live context with
            past contexts (its edge and tool memories) as well as with tool texts, and the ranking loss trains
            only the second.
    """

    batch_size: int = 32
    lr: float = 2e-5
    warmup: float = 0.1
    weight_decay: float = 0.0
    epochs: int = 1
    scale: float = 20.0
    max_seq_length: int = 128
    seed: int = 0
    layers: tuple[int, ...] = ()
    from_teacher: bool = False
    context_weight: float = 0.0

    def __post_init__(self):
        check_types(self)
        # a YAML list arrives as a list; sorted, since the cut keeps the base's order ([5, 0] is [0, 5])
        object.__setattr__(self, "layers", tuple(sorted(int(i) for i in self.layers)))
        if len(set(self.layers)) != len(self.layers) or any(i < 0 for i in self.layers):
            raise ValueError(f"encoder_training.layers must be distinct layer indices >= 0, got "
                             f"{list(self.layers)}")
        if self.from_teacher and not self.layers:
            raise ValueError("encoder_training.from_teacher cuts a student from its full-size teacher, so it "
                             "needs layers")
        if self.context_weight < 0:
            raise ValueError(f"encoder_training.context_weight must be >= 0, got {self.context_weight}")

    @property
    def needs_teacher(self) -> bool:
        """A student cut from its full-depth teacher (:meth:`teacher`)."""
        return self.from_teacher

    def teacher(self) -> TrainConfig:
        """The recipe of a student's teacher: this one at full depth, on the ranking loss alone (context
        weight 0: a student with the context term shares its teacher with the students without it)."""
        return replace(self, layers=(), from_teacher=False, context_weight=0.0)

    def key(self) -> dict:
        """The fields as they enter a checkpoint's cache key (``OPTIONAL_FIELDS`` only when set)."""
        d = asdict(self) | {"layers": list(self.layers)}
        return {k: v for k, v in d.items() if k not in OPTIONAL_FIELDS or v}


@dataclass(frozen=True)
class EncoderRecipe:
    """One ``encoder_training`` config: what is trained on each fold's pairs and how it is served.

    Args:
        train: the optimisation (:class:`TrainConfig`; its fields sit at the top level of the YAML).
        kind: ``transformer`` (fine-tune a sentence-transformers model,
            :mod:`tracer.learn.encoders.transformer`) or ``static`` (train a model2vec token table,
            :mod:`tracer.learn.encoders.static`).
        context: the anchor text's rendering (tracer_plus's vector query,
            ``configs/scorer/tracer_plus.yaml``).
        successful_only: pairs from successful trajectories only.
        base_model: a local sentence-transformers folder to start from; None: the bundled all-MiniLM-L6-v2.
        encoder_dir: where checkpoints are cached, by a content hash of pairs, recipe and base weights.
        device: where a transformer trains (None: CUDA when present); a static table trains on the CPU.
        inner_encoders: also train one encoder per inner fold of tracer_plus's candidate model, without that
            fold, so no step the model is fitted on reached the encoder that scores it.
        pca_dims: static only: the width of the distillation the table starts from
            (``configs/embedder/static.yaml``).
        serve_as: transformer only: the embedder that serves a checkpoint, a config name of
            ``configs/embedder/`` or a mapping (``_target_`` and arguments), completed with
            ``model=<checkpoint folder>``. A static table is served by
            :class:`tracer.encode.static.StaticEmbedder`.
        slow: a second recipe, trained on the same trajectories and served as the resources' ``slow`` encoder
            (a cascade's second stage, :class:`tracer.scorers.cascade.CascadeScorer`); it has no ``slow`` of
            its own.
    """

    train: TrainConfig = TrainConfig()
    kind: Literal["transformer", "static"] = "transformer"
    context: ContextRendering = field(default_factory=ContextRendering)
    successful_only: bool = True
    base_model: str | None = None
    encoder_dir: str = DEFAULT_CACHE
    device: str | None = None
    inner_encoders: bool = False
    pca_dims: int | None = 256
    serve_as: str | Mapping[str, Any] = "finetuned"
    slow: EncoderRecipe | None = None

    def __post_init__(self):
        check_types(self)
        if self.kind not in KINDS:
            raise ValueError(f"encoder_training.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "static" and self.train.layers:
            raise ValueError(f"encoder_training.layers cut a transformer's depth; kind {self.kind!r} has no "
                             f"layers")
        if self.kind == "static" and self.serve_as != "finetuned":
            raise ValueError("encoder_training.serve_as: a static table is served as a StaticEmbedder of "
                             "itself")
        if self.slow is not None and self.slow.slow is not None:
            raise ValueError("encoder_training.slow.slow: a cascade has two stages, its slow recipe has no "
                             "slow stage")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], where: str = "encoder_training") -> EncoderRecipe:
        """The recipe of a config mapping (a composed ``encoder_training`` node, plain):
        :class:`TrainConfig`'s keys go to ``train``, ``context`` to a :class:`ContextRendering`, ``slow`` to a
        recipe of its own."""
        own = {f.name for f in fields(cls)} - {"train"}
        trains = {f.name for f in fields(TrainConfig)}
        if unknown := sorted(set(cfg) - own - trains):
            raise ValueError(f"{where}.{unknown[0]}: not a recipe key; the keys are "
                             f"{', '.join(sorted(own | trains))}")
        slow = cfg.get("slow")
        if slow is not None and not isinstance(slow, Mapping):
            raise ValueError(f"{where}.slow must be a recipe (a mapping, e.g. '- mnrl_int8@slow' in a "
                             f"defaults list), got {slow!r}")
        args = {k: v for k, v in cfg.items() if k in own}
        if "context" in args:
            args["context"] = ContextRendering.from_config(args["context"])
        if slow is not None:
            args["slow"] = cls.from_config(slow, f"{where}.slow")
        if args.get("serve_as") is None:
            args.pop("serve_as", None)
        if isinstance(args.get("serve_as"), Mapping):
            args["serve_as"] = dict(args["serve_as"])
        return cls(train=TrainConfig(**{k: v for k, v in cfg.items() if k in trains}), **args)

    def served(self, checkpoint: str) -> tuple[str | dict[str, Any], dict[str, Any]]:
        """The embedder config that serves ``checkpoint`` (a name or a mapping) and the arguments it is
        completed with: what ``tracer.build.build_embedder(config, **arguments)`` builds."""
        if self.kind == "static":
            return ({"_target_": "tracer.encode.static.StaticEmbedder", "pca_dims": self.pca_dims,
                     "encoder_dir": str(self.encoder_dir)}, {"model": checkpoint})
        return self.serve_as, {"model": checkpoint}
