"""Contrastive fine-tuning of the sentence-transformers encoder on logged trajectories.

Each decision step of a successful training trajectory gives one pair: the context rendered as
tracer_plus renders its vector query (anchor) and the gold tool's text as the scorers embed it,
``Tool.search_text`` (positive). The loss is sentence-transformers' MultipleNegativesRankingLoss:
for a batch of B pairs, cross-entropy of anchor i over the B positives (scale 20, cosine), so the
other tools in the batch are the negatives. A batch never holds the same anchor text or the same
tool twice (a repeated tool would be a false negative). With ``negatives: trie`` each pair also
carries one hard negative, another child of its trie state (:func:`tracer.learn.pairs.trie_negatives`), which every
anchor of the batch is ranked against too (MNRL's third column). AdamW, linear warm-up then decay, one
epoch, seeded; CUDA when present (not run here), else the CPU, where a run is deterministic.

The checkpoint lands atomically in ``<encoder_dir>/finetuned-<hash>/``, the hash covering the pairs,
the recipe and the base weights: a rerun on the same training data loads it instead of training.
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

from tracer.core.io import atomic_new_dir, write_json
from tracer.encode.embedders import default_device
from tracer.encode.source import DEFAULT_CACHE, folder_hash, model_folder, recipe_hash
from tracer.learn.pairs import Pairs, no_duplicate_batches

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


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

    def __post_init__(self):
        # a YAML list arrives as a list; sorted, since the cut keeps the base's order ([5, 0] is [0, 5], one key)
        object.__setattr__(self, "layers", tuple(sorted(int(i) for i in self.layers)))
        if len(set(self.layers)) != len(self.layers) or any(i < 0 for i in self.layers):
            raise ValueError(f"encoder_training.layers must be distinct layer indices >= 0, got {list(self.layers)}")
        if self.distill < 0 or (self.distill > 0 and not self.layers):
            raise ValueError(f"encoder_training.distill must be >= 0, and > 0 only for a student (layers set): its "
                             f"teacher is the same recipe at full depth; got distill {self.distill} with layers "
                             f"{list(self.layers)}")

    def teacher(self) -> TrainConfig:
        """The recipe of a student's teacher: this one at full depth, without distillation."""
        return replace(self, layers=(), distill=0.0)

    def key(self) -> dict:
        """The fields as they enter a checkpoint's cache key (``layers`` and ``distill`` only when set)."""
        d = asdict(self) | {"layers": list(self.layers)}
        return {k: v for k, v in d.items() if (k != "layers" or self.layers) and (k != "distill" or self.distill)}


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
          teacher: str | Path | None = None) -> tuple[SentenceTransformer, dict]:
    """Fine-tune ``base_model`` on ``pairs``; returns the model (eval mode) and a summary with the loss per step.
    With ``cfg.distill``, ``teacher`` is the checkpoint whose embeddings the student is pulled towards."""
    if len(pairs) < 2:
        raise ValueError(f"encoder training needs at least 2 pairs, got {len(pairs)}")
    if bool(cfg.distill) != (teacher is not None):
        raise ValueError(f"encoder training: a teacher goes with distill > 0 and only then (distill {cfg.distill}, "
                         f"teacher {teacher})")
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
    own_length = model.max_seq_length
    model.max_seq_length = min(cfg.max_seq_length, own_length)
    loss_fn = MultipleNegativesRankingLoss(model, scale=cfg.scale)
    # the teacher's vectors of each pair's anchor and positive, [N, d] each
    targets = _teacher_vectors(teacher, (pairs.anchors, pairs.positives), model.max_seq_length, device) \
        if teacher is not None else None
    batches = [b for e in range(cfg.epochs) for b in no_duplicate_batches(pairs, cfg.batch_size, cfg.seed + e)]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = get_linear_schedule_with_warmup(opt, int(cfg.warmup * len(batches)), len(batches))
    model.train()
    losses, t0 = [], time.perf_counter()
    # MNRL scores each anchor against every positive and, when present, every hard negative of the batch
    columns = (pairs.anchors, pairs.positives) + ((pairs.negatives,) if pairs.negatives is not None else ())
    for step, batch in enumerate(batches):
        feats = [_features(model, [col[i] for i in batch], device) for col in columns]
        if targets is None:
            loss = loss_fn(feats, torch.empty(0, device=device))
        else:  # the ranking loss on the same embeddings, plus their squared distance to the teacher's
            embs = embed_columns(model, feats)                                          # [B, d] per column
            loss = loss_fn.compute_loss_from_embeddings(embs, torch.empty(0, device=device))
            for emb, target in zip(embs[:2], targets):
                loss = loss + cfg.distill * (emb - target[batch]).pow(2).sum(1).mean()
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
            "config": cfg.key()}
    return model, info


def _teacher_vectors(teacher: str | Path, columns: Sequence[Sequence[str]], max_seq_length: int,
                     device: str) -> list[torch.Tensor]:
    """The teacher's unit embeddings of each column's texts (truncated as the student trains), ``[N, d]`` per
    column; each distinct text is encoded once."""
    from sentence_transformers import SentenceTransformer

    net = SentenceTransformer(str(teacher), device=device)
    net.max_seq_length = min(max_seq_length, net.max_seq_length)
    unique = sorted({t for col in columns for t in col})
    with torch.no_grad():
        vecs = net.encode(unique, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)  # [U, d]
    row = {t: i for i, t in enumerate(unique)}
    return [vecs[torch.tensor([row[t] for t in col], device=vecs.device)] for col in columns]


def keep_layers(model: SentenceTransformer, layers: Sequence[int]) -> None:
    """Cut a BERT-style sentence-transformers model down to the given transformer layers, in place
    (their order kept; the saved config then says ``num_hidden_layers = len(layers)``)."""
    net = model[0].auto_model
    stack = getattr(getattr(net, "encoder", None), "layer", None)
    if not isinstance(stack, torch.nn.ModuleList):
        raise TypeError(f"encoder_training.layers: the base model ({type(net).__name__}) has no BERT-style "
                        f"encoder.layer stack to cut")
    if max(layers) >= len(stack):
        raise ValueError(f"encoder_training.layers {list(layers)}: the base model has {len(stack)} layers "
                         f"(indices 0-{len(stack) - 1})")
    net.encoder.layer = torch.nn.ModuleList(stack[i] for i in sorted(layers))  # the base's order
    net.config.num_hidden_layers = len(layers)


def checkpoint_dir(pairs: Pairs, cfg: TrainConfig, base_model: str | Path | None,
                   encoder_dir: str | Path = DEFAULT_CACHE) -> Path:
    """Where the checkpoint for these pairs, recipe and base weights lives (content-addressed)."""
    key = recipe_hash(kind="finetune-mnrl", pairs=pairs.digest(), config=cfg.key(),
                      weights=folder_hash(model_folder(base_model)))
    return Path(encoder_dir) / f"finetuned-{key[:16]}"


def finetuned(pairs: Pairs, cfg: TrainConfig = TrainConfig(), base_model: str | Path | None = None,
              encoder_dir: str | Path = DEFAULT_CACHE, device: str | None = None,
              log: Callable[[dict], None] | None = None) -> Path:
    """The fine-tuned checkpoint folder for ``pairs``: trained and saved atomically on a miss, reused on a hit.

    The folder is a sentence-transformers model (``embedder=finetuned embedder.model=<folder>``)
    plus ``train_info.json`` (loss curve, wall time).
    """
    out = checkpoint_dir(pairs, cfg, base_model, encoder_dir)
    if (out / "train_info.json").is_file():
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    teacher = finetuned(pairs, cfg.teacher(), base_model, encoder_dir, device, log) if cfg.distill else None
    model, info = train(pairs, cfg, base_model, device, log, teacher)
    with atomic_new_dir(out) as tmp:
        model.save(str(tmp))
        write_json(tmp / "train_info.json", info | {"base_model": str(model_folder(base_model))}
                   | ({"teacher": str(teacher)} if teacher else {}))
    return out


def train_info(checkpoint: str | Path) -> dict:
    return json.loads((Path(checkpoint) / "train_info.json").read_text())
