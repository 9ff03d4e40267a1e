"""Contrastive fine-tuning of the sentence-transformers encoder on logged trajectories.

Each decision step of a successful training trajectory gives one pair: the context rendered as
tracer_plus renders its vector query (anchor) and the gold tool's text as the scorers embed it,
``Tool.search_text`` (positive). The loss is sentence-transformers' MultipleNegativesRankingLoss:
for a batch of B pairs, cross-entropy of anchor i over the B positives (scale 20, cosine), so the
other tools in the batch are the negatives. A batch never holds the same anchor text or the same
tool twice (a repeated tool would be a false negative). With ``negatives: trie`` each pair also
carries one hard negative, another child of its trie state (:func:`tracer.learn.pairs.trie_negatives`), which every
anchor of the batch is ranked against too (MNRL's third column). With ``fixed_tools`` the model trained is a
query encoder only: each anchor is ranked against a teacher's frozen vectors of every registry tool
(cross-entropy over the registry), and the teacher embeds the tools when serving
(:class:`tracer.encode.dual.DualEmbedder`). AdamW, linear warm-up then decay, one epoch, seeded; CUDA when
present (not run here), else the CPU, where a run is deterministic.

The checkpoint lands atomically in ``<encoder_dir>/finetuned-<hash>/``, the hash covering the pairs,
the recipe and the base weights: a rerun on the same training data loads it instead of training, once it matches
the manifest written with it (a damaged one is moved aside and trained again, :mod:`tracer.encode.manifest`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tracer.core.io import write_json
from tracer.encode.embedders import default_device
from tracer.encode.manifest import new_artifact, reuse
from tracer.encode.source import DEFAULT_CACHE, model_folder, recipe_hash, source_hash
from tracer.learn.pairs import Pairs, context_partners, no_duplicate_batches, texts_digest
from tracer.learn.student import keep_layers, narrow_ffn

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


# the fields of a student recipe, which enter a checkpoint's key only when set (full-size recipes' keys stay)
STUDENT_FIELDS = ("layers", "distill", "fixed_tools", "from_teacher", "ffn")
# the fields that enter a checkpoint's key only when set, so that the keys of the runs already cached stay
OPTIONAL_FIELDS = STUDENT_FIELDS + ("context_weight",)


@dataclass(frozen=True)
class TrainConfig:
    """The recipe (every field enters the checkpoint's cache key).

    Args:
        batch_size: pairs per batch (in-batch negatives: B - 1 per anchor).
        lr: AdamW peak learning rate; ``warmup`` is the fraction of steps it ramps up over.
        weight_decay: AdamW weight decay (0, as sentence-transformers' trainer).
        epochs: passes over the pairs.
        scale: the loss's inverse temperature on cosine similarities.
        max_seq_length: truncation while training (the checkpoint keeps the model's own for encoding).
        seed: batches, dropout and initial state.
        layers: the base model's transformer layers to keep, by index (``()``: all). A shallower student
            is fine-tuned as it is and saved with only those layers: encoding costs about in proportion
            to the layers kept (sentence-transformers' layer-reduction distillation keeps every other
            layer likewise). Enters the cache key only when set, so the keys of full-depth recipes stay.
        distill: students only: the weight of an embedding-distillation term added to the loss, ``distill`` x
            the mean squared distance between the student's and a teacher's unit embeddings of the batch's
            anchors and positives (sentence-transformers' MSE distillation, on top of the ranking loss). The
            teacher is this recipe at full depth fine-tuned on the same pairs (:func:`finetuned` trains or
            finds it), so it saw nothing the student did not. Enters the cache key only when set.
        fixed_tools: train a query (context) encoder for a teacher's frozen tool vectors instead of both sides:
            the loss is the cross-entropy, at ``scale``, of each anchor's cosine to the teacher's vectors of every
            candidate tool (the registry, :func:`finetuned`'s ``candidates``), its gold tool the target: the
            retrieval objective itself, affordable because the tool side is not trained. The teacher is this
            recipe at full depth and symmetric, fine-tuned on the same pairs; it embeds the tools where the
            checkpoint is served (a ``DualEmbedder``), so a live step pays only for this model (a shallow
            student: ``layers``). With ``distill``, its term is on the anchors only: the tool side already is
            the teacher's, and the contexts are compared with other contexts too (tracer_plus's memories).
            Enters the cache key only when set, with the candidates.
        ffn: the width to narrow every layer's feed-forward block to before fine-tuning (``0``: as it is; MiniLM's
            is 1536): its neurons least used on the pairs' texts are dropped (:func:`tracer.learn.student.narrow_ffn`),
            after the layer cut. Enters the cache key only when set.
        from_teacher: students only: cut the student (layers, ffn) from the teacher (this recipe at full size,
            fine-tuned on the same pairs) instead of from the base model, then fine-tune as usual (layer reduction after
            fine-tuning, as sentence-transformers' model-distillation example builds its student). Enters the
            cache key only when set.
        context_weight: the weight of a second in-batch term, context to context: each anchor ranked against the
            batch's partner contexts, its positive another training context that called the same tool
            (:func:`tracer.learn.pairs.context_partners`, drawn again each epoch; anchors whose tool has no other
            context are left out of it). tracer_plus compares a live context with past contexts (its edge and tool
            memories) as well as with tool texts, and the ranking loss trains only the second; the static trainer
            has the same term (``encoder_training.context_weight``). Not with ``fixed_tools``. Enters the cache key
            only when set.
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
    distill: float = 0.0
    fixed_tools: bool = False
    from_teacher: bool = False
    ffn: int = 0
    context_weight: float = 0.0

    def __post_init__(self):
        # a YAML list arrives as a list; sorted, since the cut keeps the base's order ([5, 0] is [0, 5], one key)
        object.__setattr__(self, "layers", tuple(sorted(int(i) for i in self.layers)))
        if len(set(self.layers)) != len(self.layers) or any(i < 0 for i in self.layers):
            raise ValueError(f"encoder_training.layers must be distinct layer indices >= 0, got {list(self.layers)}")
        if self.ffn < 0:
            raise ValueError(f"encoder_training.ffn must be >= 0 (0: the feed-forward width as it is), got {self.ffn}")
        if self.from_teacher and not self.student:
            raise ValueError("encoder_training.from_teacher cuts a student from its full-size teacher, so it needs "
                             "layers or ffn")
        if self.distill < 0 or (self.distill > 0 and not self.student):
            raise ValueError(f"encoder_training.distill must be >= 0, and > 0 only for a student (layers or ffn set): "
                             f"its teacher is the same recipe at full size; got distill {self.distill} with layers "
                             f"{list(self.layers)}, ffn {self.ffn}")
        if self.context_weight < 0 or (self.context_weight > 0 and self.fixed_tools):
            raise ValueError(f"encoder_training.context_weight must be >= 0, and 0 with fixed_tools (a query encoder's "
                             f"loss is over the registry's tool vectors), got {self.context_weight}")

    @property
    def student(self) -> bool:
        """A model cut smaller than its base (fewer layers, a narrower feed-forward block)."""
        return bool(self.layers or self.ffn)

    @property
    def needs_teacher(self) -> bool:
        """A student built from, pulled towards or ranked against its full-depth teacher (:meth:`teacher`)."""
        return bool(self.distill or self.fixed_tools or self.from_teacher)

    def teacher(self) -> TrainConfig:
        """The recipe of a student's teacher: this one at full size (every layer, full width), without distillation
        and on the ranking loss alone (``context_weight`` 0: a student with the context term shares its teacher with
        the students without it)."""
        return replace(self, layers=(), distill=0.0, fixed_tools=False, from_teacher=False, ffn=0, context_weight=0.0)

    def key(self) -> dict:
        """The fields as they enter a checkpoint's cache key (``OPTIONAL_FIELDS`` only when set)."""
        d = asdict(self) | {"layers": list(self.layers)}
        return {k: v for k, v in d.items() if k not in OPTIONAL_FIELDS or v}


def print_progress(every: int = 10) -> Callable[[dict], None]:
    """A ``log`` for :func:`train` that prints the step, loss and seconds so far to stderr every ``every``
    steps (a fine-tuning on a busy CPU takes tens of minutes; the scripts show it moving)."""
    t0 = time.perf_counter()

    def log(m: dict) -> None:
        if m["encoder/step"] % every == 0:
            print(f"step {m['encoder/step']} loss {m['encoder/loss']:.4f} {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    return log


def _features(model: SentenceTransformer, texts: Sequence[str], device: str) -> dict[str, torch.Tensor]:
    # preprocess also returns non-tensor entries (the input modality): those pass through as they are
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in model.preprocess(list(texts)).items()}


def train(pairs: Pairs, cfg: TrainConfig = TrainConfig(), base_model: str | Path | None = None,
          device: str | None = None, log: Callable[[dict], None] | None = None,
          teacher: str | Path | None = None, candidates: Sequence[str] | None = None) -> tuple[SentenceTransformer, dict]:
    """Fine-tune ``base_model`` on ``pairs``; returns the model (eval mode) and a summary with the loss per step.
    With ``cfg.distill``, ``teacher`` is the checkpoint whose embeddings the student is pulled towards; with
    ``cfg.fixed_tools``, the one whose vectors of the ``candidates`` (tool texts, every positive among them) the
    anchors are ranked against."""
    if len(pairs) < 2:
        raise ValueError(f"encoder training needs at least 2 pairs, got {len(pairs)}")
    if bool(cfg.distill or cfg.fixed_tools) != (teacher is not None):
        raise ValueError(f"encoder training: a teacher goes with distill > 0 or fixed_tools, and only then (distill "
                         f"{cfg.distill}, fixed_tools {cfg.fixed_tools}, teacher {teacher})")
    if cfg.fixed_tools:
        row = {t: i for i, t in enumerate(candidates or ())}
        if missing := sorted({p for p in pairs.positives if p not in row}):
            raise ValueError(f"encoder training with fixed_tools: {len(missing)} positives are not among the "
                             f"{len(row)} candidates, e.g. {missing[0][:80]!r}")
    # imported here: the full sentence-transformers package costs ~3 s more at import than the embedders'
    # part of it, and every evaluate.py / tracer start imports this module whether it fine-tunes or not
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.losses.merged_forward import embed_columns
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import get_linear_schedule_with_warmup

    device = device or default_device()
    torch.manual_seed(cfg.seed)
    model = SentenceTransformer(str(model_folder(base_model)), device=device)
    if cfg.layers:
        keep_layers(model, cfg.layers)
    if cfg.ffn:  # the neurons kept are those most used on the pairs' own texts
        narrow_ffn(model, cfg.ffn, sorted(set(pairs.anchors) | set(pairs.positives)), seed=cfg.seed)
    own_length = model.max_seq_length
    model.max_seq_length = min(cfg.max_seq_length, own_length)
    loss_fn = MultipleNegativesRankingLoss(model, scale=cfg.scale)
    t_teacher = time.perf_counter()
    net = SentenceTransformer(str(teacher), device=device) if teacher is not None else None
    # the teacher's vectors of the pairs' texts the student embeds, [N, d] per column (a query student: anchors only)
    distilled = (pairs.anchors,) if cfg.fixed_tools else (pairs.anchors, pairs.positives)
    targets = unit_vectors(net, distilled, model.max_seq_length) if cfg.distill else None
    if cfg.fixed_tools:  # the tool side as the teacher serves it: its own truncation
        tool_vecs = unit_vectors(net, (candidates,), net.max_seq_length)[0]           # [R, d]
        gold = torch.tensor([row[p] for p in pairs.positives], device=device)            # [N]
    teacher_seconds = round(time.perf_counter() - t_teacher, 2)
    per_epoch = [no_duplicate_batches(pairs, cfg.batch_size, cfg.seed + e) for e in range(cfg.epochs)]
    batches = [b for epoch in per_epoch for b in epoch]
    epoch_of = [e for e, epoch in enumerate(per_epoch) for _ in epoch]
    partners = [context_partners(pairs, cfg.seed + e) for e in range(cfg.epochs)] if cfg.context_weight else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = get_linear_schedule_with_warmup(opt, int(cfg.warmup * len(batches)), len(batches))
    model.train()
    losses, t0 = [], time.perf_counter()
    # MNRL scores each anchor against every positive and, when present, every hard negative of the batch
    columns = (pairs.anchors, pairs.positives) + ((pairs.negatives,) if pairs.negatives is not None else ())
    for step, batch in enumerate(batches):
        if cfg.fixed_tools:  # the anchors' cosines to every candidate tool, the gold one the target
            q = embed_columns(model, [_features(model, [pairs.anchors[i] for i in batch], device)])[0]  # [B, d]
            q = torch.nn.functional.normalize(q, dim=-1)
            loss = torch.nn.functional.cross_entropy(cfg.scale * q @ tool_vecs.T, gold[batch])           # [B, R] logits
            if targets is not None:  # and the contexts' squared distance to the teacher's
                loss = loss + cfg.distill * (q - targets[0][batch]).pow(2).sum(1).mean()
        else:
            feats = [_features(model, [col[i] for i in batch], device) for col in columns]
            both = [(r, j) for r, i in enumerate(batch) if (j := partners[epoch_of[step]][i]) is not None] \
                if partners is not None else []
            if len(both) > 1:  # the partner contexts, one more column embedded in the same pass
                feats.append(_features(model, [pairs.anchors[j] for _, j in both], device))
            if targets is None and len(feats) == len(columns):
                loss = loss_fn(feats, torch.empty(0, device=device))
            else:  # the ranking loss on the same embeddings, plus the other terms
                embs = embed_columns(model, feats)                                          # [B, d] per column
                loss = loss_fn.compute_loss_from_embeddings(embs[:len(columns)], torch.empty(0, device=device))
                for emb, target in zip(embs[:2], targets or ()):  # the squared distance to the teacher's
                    loss = loss + cfg.distill * (emb - target[batch]).pow(2).sum(1).mean()
                if len(feats) > len(columns):  # each anchor against the partners, its own the target
                    a = torch.nn.functional.normalize(embs[0][[r for r, _ in both]], dim=-1)         # [B', d]
                    c = torch.nn.functional.normalize(embs[-1], dim=-1)                            # [B', d]
                    loss = loss + cfg.context_weight * torch.nn.functional.cross_entropy(
                        cfg.scale * a @ c.T, torch.arange(len(both), device=device))              # [B', B']
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if log is not None:
            log({"encoder/loss": losses[-1], "encoder/lr": sched.get_last_lr()[0], "encoder/step": step})
    model.eval()
    model.max_seq_length = own_length
    info = {"pairs": len(pairs), "batches": len(batches), "pairs_used": sum(map(len, batches)),
            "train_seconds": round(time.perf_counter() - t0, 2), "device": device, "loss": losses,
            "config": cfg.key()} | ({"teacher_vectors_seconds": teacher_seconds} if teacher is not None else {})
    return model, info


def unit_vectors(net: SentenceTransformer, columns: Sequence[Sequence[str]], max_seq_length: int) -> list[torch.Tensor]:
    """A (teacher) model's unit embeddings of each column's texts truncated at ``max_seq_length`` (the student's
    training length, or the model's own, as it serves), ``[N, d]`` per column; each distinct text encoded once."""
    own, net.max_seq_length = net.max_seq_length, min(max_seq_length, net.max_seq_length)
    unique = sorted({t for col in columns for t in col})
    with torch.no_grad():
        vecs = net.encode(unique, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)  # [U, d]
    net.max_seq_length = own
    vecs = vecs.clone()  # out of inference mode: autograd may keep it for backward
    row = {t: i for i, t in enumerate(unique)}
    return [vecs[torch.tensor([row[t] for t in col], device=vecs.device)] for col in columns]


def checkpoint_dir(pairs: Pairs, cfg: TrainConfig, base_model: str | Path | None,
                   encoder_dir: str | Path = DEFAULT_CACHE, candidates: Sequence[str] | None = None) -> Path:
    """Where the checkpoint for these pairs, recipe, base weights and (``fixed_tools``) candidate tools lives
    (content-addressed)."""
    extra = {"candidates": texts_digest(candidates or ())} if cfg.fixed_tools else {}
    key = recipe_hash(kind="finetune-mnrl", pairs=pairs.digest(), config=cfg.key(),
                      weights=source_hash(base_model)[1], **extra)
    return Path(encoder_dir) / f"finetuned-{key[:16]}"


def finetuned(pairs: Pairs, cfg: TrainConfig = TrainConfig(), base_model: str | Path | None = None,
              encoder_dir: str | Path = DEFAULT_CACHE, device: str | None = None,
              log: Callable[[dict], None] | None = None, candidates: Sequence[str] | None = None) -> Path:
    """The fine-tuned checkpoint folder for ``pairs``: trained and saved atomically on a miss, reused on a hit.

    The folder is a sentence-transformers model (``embedder=finetuned embedder.model=<folder>``)
    plus ``train_info.json`` (loss curve, wall time, and the teacher's folder where there is one: with
    ``fixed_tools`` it is the tool side to serve beside it). ``candidates``: the tool texts a ``fixed_tools``
    query encoder ranks against (the registry's ``search_text``).
    """
    if cfg.fixed_tools and not candidates:
        raise ValueError("encoder training with fixed_tools needs the candidate tool texts (the registry)")
    out = checkpoint_dir(pairs, cfg, base_model, encoder_dir, candidates)
    cached = reuse(out) is not None  # a damaged or unfinished one is moved aside and trained again
    if cached and not cfg.fixed_tools:
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # a query encoder is served beside its teacher: that one is verified (or trained again) even on a hit
    teacher = finetuned(pairs, cfg.teacher(), base_model, encoder_dir, device, log) if cfg.needs_teacher else None
    if cached:
        return out
    model, info = train(pairs, cfg, teacher if cfg.from_teacher else base_model, device, log,
                        teacher if cfg.distill or cfg.fixed_tools else None, candidates)
    # sealed with the checkpoint's key (tracer.encode.manifest); config.from_teacher says when the teacher is also
    # where the layers came from
    with new_artifact(out, {"kind": "finetune-mnrl", "key": out.name}) as tmp:
        model.save(str(tmp))
        write_json(tmp / "train_info.json", info | {"base_model": str(model_folder(base_model))}
                   | ({"teacher": str(teacher)} if teacher else {}))
    return out


def train_info(checkpoint: str | Path) -> dict:
    return json.loads((Path(checkpoint) / "train_info.json").read_text())
