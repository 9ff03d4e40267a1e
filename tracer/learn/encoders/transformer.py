"""Contrastive fine-tuning of a sentence-transformers encoder on logged trajectories.

Each decision step of a successful training trajectory gives one pair (:mod:`tracer.learn.encoders.pairs`):
the context rendered as tracer_plus renders its vector query (anchor) and the gold tool's text as the scorers
embed it, ``Tool.search_text`` (positive). Each step's loss is the sum of the recipe's terms
(:func:`losses_for`): the in-batch ranking loss
(:class:`~tracer.learn.encoders.losses.MultipleNegativesRanking`), plus the context-to-context term when
``context_weight`` is set. A batch never holds the same anchor text or the same tool twice (a repeated tool
would be a false negative). AdamW, linear warm-up then decay, seeded; CUDA when present, else the CPU, where a
run is deterministic. A student (``layers``) is cut from the base model, or with ``from_teacher`` from the
full-depth recipe fine-tuned on the same pairs first. Under ``torchrun`` each batch is split over the ranks
and trained as one global batch (:mod:`tracer.learn.distributed`); rank 0 writes the checkpoint.

The checkpoint lands atomically in ``<encoder_dir>/finetuned-<hash>/``, the hash covering the pairs, the
recipe and the base weights: a rerun on the same training data loads it instead of training, once it matches
the manifest written with it (a damaged one is moved aside and trained again, :mod:`tracer.encode.manifest`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tracer.core.io import write_json
from tracer.encode.embedders import default_device
from tracer.encode.manifest import new_artifact, reuse
from tracer.encode.source import DEFAULT_CACHE, model_folder, recipe_hash, source_hash
from tracer.learn import distributed
from tracer.learn.encoders.losses import (
    ContextRanking,
    EmbeddedBatch,
    EncoderLoss,
    MultipleNegativesRanking,
    total,
)
from tracer.learn.encoders.pairs import Pairs, context_partners, no_duplicate_batches
from tracer.learn.encoders.recipe import TrainConfig
from tracer.learn.encoders.student import keep_layers

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def print_progress(every: int = 10) -> Callable[[dict], None]:
    """A ``log`` for :func:`train` that prints the step, loss and seconds so far to stderr every ``every``
    steps (a fine-tuning on a busy CPU takes tens of minutes; the scripts show it moving)."""
    t0 = time.perf_counter()

    def log(m: dict) -> None:
        if m["encoder/step"] % every == 0:
            print(f"step {m['encoder/step']} loss {m['encoder/loss']:.4f} {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    return log


def losses_for(cfg: TrainConfig, model: SentenceTransformer) -> list[EncoderLoss]:
    """The recipe's loss terms, summed each step: the ranking loss, then the context term when it has a
    weight."""
    context = [ContextRanking(cfg.context_weight, cfg.scale)] if cfg.context_weight else []
    return [MultipleNegativesRanking(model, cfg.scale), *context]


def _features(model: SentenceTransformer, texts: Sequence[str], device: str) -> dict[str, torch.Tensor]:
    # preprocess also returns non-tensor entries (the input modality): those pass through as they are
    features = model.preprocess(list(texts))
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}


def train(pairs: Pairs, cfg: TrainConfig, base_model: str | Path | None = None, device: str | None = None,
          log: Callable[[dict], None] | None = None) -> tuple[SentenceTransformer, dict]:
    """Fine-tune ``base_model`` (cut to ``cfg.layers``) on ``pairs``; returns the model (eval mode) and a
    summary with the loss per step. Fewer than 2 pairs give no in-batch negative to rank against: no step is
    taken and the start model is returned as it is (a cold start keeps what the base model knows)."""
    # imported here: the full sentence-transformers package costs ~3 s more at import than the embedders'
    # part of it, and every evaluate.py / tracer start imports this module whether it fine-tunes or not
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.losses.merged_forward import embed_columns
    from transformers import get_linear_schedule_with_warmup

    device = device or default_device()
    torch.manual_seed(cfg.seed)
    model = SentenceTransformer(str(model_folder(base_model)), device=device, local_files_only=True)
    if cfg.layers:
        keep_layers(model, cfg.layers)
    own_length = model.max_seq_length
    model.max_seq_length = min(cfg.max_seq_length, own_length)
    terms = losses_for(cfg, model)
    per_epoch = [no_duplicate_batches(pairs, cfg.batch_size, cfg.seed + e) if len(pairs) > 1 else []
                 for e in range(cfg.epochs)]
    batches = [b for epoch in per_epoch for b in epoch]
    epoch_of = [e for e, epoch in enumerate(per_epoch) for _ in epoch]
    partners = ([context_partners(pairs, cfg.seed + e) for e in range(cfg.epochs)] if cfg.context_weight
                else None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = get_linear_schedule_with_warmup(opt, int(cfg.warmup * len(batches)), len(batches))
    model.train()
    # under torchrun each rank embeds a shard of every batch (tracer.learn.distributed),
    # with dropout of its own
    world = distributed.world_size()
    # the library's version is asked, as in SentenceTransformerEmbedder: the method was renamed in 6.x
    dim = (getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)()
    if distributed.rank() > 0:
        torch.manual_seed(distributed.rank_seed(cfg.seed))

    def embed(columns: Sequence[Sequence[str]]) -> list[torch.Tensor]:                  # [n_c, d] per column
        return distributed.gather_columns(
            lambda cols: embed_columns(model, [_features(model, col, device) for col in cols]), columns, dim,
            device)

    losses, t0 = [], time.perf_counter()
    for step, batch in enumerate(batches):
        columns = [[col[i] for i in batch] for col in (pairs.anchors, pairs.positives)]
        both = [(r, j) for r, i in enumerate(batch) if (j := partners[epoch_of[step]][i]) is not None] \
            if partners is not None else []
        if len(both) > 1:  # the partner contexts, one more column embedded in the same pass
            columns.append([pairs.anchors[j] for _, j in both])
        embs = embed(columns)                                                    # [B, d] per column
        loss = total(terms, EmbeddedBatch(embs[0], embs[1], unit=False,
                                          partner_rows=[r for r, _ in both] if len(embs) > 2 else None,
                                          partners=embs[2] if len(embs) > 2 else None))
        opt.zero_grad()
        # every rank computes the whole batch's loss; its gradient reaches each shard once per rank
        (loss / world if world > 1 else loss).backward()
        distributed.sum_gradients(list(model.parameters()))
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if log is not None:
            log({"encoder/loss": losses[-1], "encoder/lr": sched.get_last_lr()[0], "encoder/step": step})
    model.eval()
    model.max_seq_length = own_length
    info = {"pairs": len(pairs), "batches": len(batches), "pairs_used": sum(map(len, batches)),
            "train_seconds": round(time.perf_counter() - t0, 2), "device": device, "loss": losses,
            "config": cfg.key()} | ({"world_size": world} if world > 1 else {})
    return model, info


def checkpoint_dir(pairs: Pairs, cfg: TrainConfig, base_model: str | Path | None,
                   encoder_dir: str | Path = DEFAULT_CACHE) -> Path:
    """Where the checkpoint for these pairs, recipe and base weights lives (content-addressed; under torchrun
    also keyed by the world size, :func:`tracer.learn.distributed.world_key`)."""
    key = recipe_hash(kind="finetune-mnrl", pairs=pairs.digest(), config=cfg.key(),
                      weights=source_hash(base_model)[1], **distributed.world_key())
    return Path(encoder_dir) / f"finetuned-{key[:16]}"


def finetuned(pairs: Pairs, cfg: TrainConfig, base_model: str | Path | None = None,
              encoder_dir: str | Path = DEFAULT_CACHE, device: str | None = None,
              log: Callable[[dict], None] | None = None, record: Mapping[str, Any] | None = None) -> Path:
    """The fine-tuned checkpoint folder for ``pairs``: trained and saved atomically on a miss, reused on a
    hit.

    The folder is a sentence-transformers model (``embedder=finetuned embedder.model=<folder>``) plus
    ``train_info.json`` (loss curve, wall time, the teacher's folder for a student cut from it, and
    ``record``: what the pairs were made with and a model loading the folder must know, such as
    ``tool_text``; not part of the folder's key, which the pairs already determine).
    """
    out = checkpoint_dir(pairs, cfg, base_model, encoder_dir)
    # a damaged or unfinished one is moved aside and trained again (once: the writer checks first)
    if distributed.writer_first(lambda: reuse(out)) is not None:
        return out
    teacher = (finetuned(pairs, cfg.teacher(), base_model, encoder_dir, device, log) if cfg.needs_teacher
               else None)
    model, info = train(pairs, cfg, teacher if teacher is not None else base_model, device, log)
    # sealed with the checkpoint's key (tracer.encode.manifest); config.from_teacher says where the layers
    # came from. Under torchrun every rank holds the same weights: rank 0 saves them, the others wait
    if distributed.is_writer():
        with new_artifact(out, {"kind": "finetune-mnrl", "key": out.name}) as tmp:
            model.save(str(tmp))
            write_json(tmp / "train_info.json", info | {"base_model": str(model_folder(base_model))}
                       | ({"teacher": str(teacher)} if teacher else {}) | dict(record or {}))
    distributed.barrier()
    return out


def train_info(checkpoint: str | Path) -> dict:
    return json.loads((Path(checkpoint) / "train_info.json").read_text())
