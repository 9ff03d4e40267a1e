"""A static encoder trained contrastively on logged trajectories: the fast encoder that learns.

Distilling a fine-tuned transformer into model2vec keeps none of what fine-tuning taught it (the distillation
reads each token out of context). Here the static model's token table itself is the parameter: a text is the
mean of its tokens' rows, L2-normalised, as model2vec encodes it, and the table is trained on the same pairs
and batches as the transformer, each step's loss the sum of the recipe's terms (:func:`losses_for`: the
in-batch ranking of each context over the batch's tool texts, plus the context-to-context term when
``context_weight`` is set), starting from the model2vec distillation of the base model. One epoch over a BFCL
fold takes seconds on one CPU thread. Under ``torchrun`` each batch is split over the ranks and trained as one
global batch (:mod:`tracer.learn.distributed`); rank 0 writes the checkpoint.

The result is saved atomically as a model2vec folder in ``<encoder_dir>/m2v-trained-<hash>/`` (the layout
:class:`tracer.encode.static.StaticEmbedder` loads), the hash covering the pairs, the recipe and the starting
table; a rerun loads it once it matches the manifest written with it (a damaged one is moved aside and trained
again, :mod:`tracer.encode.manifest`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from model2vec import StaticModel

from tracer.core.io import write_json
from tracer.encode.manifest import folder_hash, new_artifact, reuse
from tracer.encode.source import DEFAULT_CACHE, recipe_hash
from tracer.encode.static import distilled
from tracer.learn import distributed
from tracer.learn.encoders.losses import ContextRanking, EmbeddedBatch, EncoderLoss, InBatchRanking, total
from tracer.learn.encoders.pairs import Pairs, context_partners, no_duplicate_batches
from tracer.learn.encoders.recipe import TrainConfig


def _bags(model: StaticModel, texts: Sequence[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[T]`` of every text, concatenated, and each text's offset ``[B]`` (embedding_bag's
    input)."""
    ids, offsets = [], []
    for enc in model.tokenizer.encode_batch(list(texts), add_special_tokens=False):
        offsets.append(len(ids))
        ids.extend(enc.ids[:max_tokens] or [0])  # an empty text reads token 0 rather than an empty bag
    return torch.tensor(ids), torch.tensor(offsets)


def encode(table: torch.Tensor, model: StaticModel, texts: Sequence[str], max_tokens: int) -> torch.Tensor:
    """Mean of the tokens' rows, L2-normalised: ``[B, d]``."""
    ids, offsets = _bags(model, texts, max_tokens)
    return F.normalize(F.embedding_bag(ids, table, offsets, mode="mean"), dim=-1)              # [B, d]


def losses_for(cfg: TrainConfig) -> list[EncoderLoss]:
    """The recipe's loss terms, summed each step: the ranking loss, then the context term when it has a
    weight."""
    context = [ContextRanking(cfg.context_weight, cfg.scale)] if cfg.context_weight else []
    return [InBatchRanking(cfg.scale), *context]


def train_static(pairs: Pairs, cfg: TrainConfig, base: StaticModel,
                 log: Callable[[dict], None] | None = None) -> tuple[np.ndarray, dict]:
    """The trained token table ``[V, d]`` and a summary (loss per step, wall time). AdamW at ``cfg.lr`` with
    no warm-up (a table of independent rows needs none), batches without a repeated anchor or tool; the
    context term's partners are drawn again each epoch (contexts whose tool has no other are left out of
    it). Fewer than 2 pairs give nothing to rank against: no step, the start table as it is."""
    torch.manual_seed(cfg.seed)
    # float64, rounded to float32 at the end: float32 kernels round differently under other vector
    # instructions and the optimiser would carry those last bits into the table (a row is a lookup either way)
    table = torch.nn.Parameter(torch.tensor(np.asarray(base.embedding, dtype=np.float64)))   # [V, d]
    opt = torch.optim.AdamW([table], lr=cfg.lr, weight_decay=cfg.weight_decay)
    terms = losses_for(cfg)
    losses, t0, step = [], time.perf_counter(), 0
    world = distributed.world_size()  # under torchrun each rank embeds a shard of every batch

    def embed(texts: Sequence[str]) -> torch.Tensor:                                                # [B, d]
        return distributed.gather_rows(lambda part: encode(table, base, part, cfg.max_seq_length), texts,
                                       table.shape[1], dtype=table.dtype)

    for epoch in range(cfg.epochs if len(pairs) > 1 else 0):
        partners = context_partners(pairs, cfg.seed + epoch) if cfg.context_weight > 0 else None
        for batch in no_duplicate_batches(pairs, cfg.batch_size, cfg.seed + epoch):
            a = embed([pairs.anchors[i] for i in batch])                                            # [B, d]
            p = embed([pairs.positives[i] for i in batch])                                          # [B, d]
            both = [(r, partners[i]) for r, i in enumerate(batch) if partners[i] is not None] \
                if partners is not None else []
            rows, c = None, None
            if len(both) > 1:
                rows = torch.tensor([r for r, _ in both])
                c = embed([pairs.anchors[j] for _, j in both])                                     # [B', d]
            loss = total(terms, EmbeddedBatch(a, p, unit=True, partner_rows=rows, partners=c))
            opt.zero_grad()
            # every rank computes the whole batch's loss; its gradient reaches each shard once per rank
            (loss / world if world > 1 else loss).backward()
            distributed.sum_gradients([table])
            opt.step()
            losses.append(float(loss.detach()))
            if log is not None:
                log({"encoder/loss": losses[-1], "encoder/step": step})
            step += 1
    # the context term's weight is reported beside the config, not in it: trained_static keys it apart
    info = {"pairs": len(pairs), "batches": step, "train_seconds": round(time.perf_counter() - t0, 2),
            "loss": losses, "config": replace(cfg, context_weight=0.0).key(),
            "context_weight": cfg.context_weight, "device": "cpu"}
    return table.detach().numpy().astype(np.float32), info


def trained_static(pairs: Pairs, cfg: TrainConfig, base_model: str | Path | None = None,
                   pca_dims: int | None = 256, encoder_dir: str | Path = DEFAULT_CACHE,
                   log: Callable[[dict], None] | None = None) -> Path:
    """The trained static model folder for ``pairs``: trained and saved atomically on a miss, reused on a hit.
    It starts from the model2vec distillation of ``base_model`` (None: MiniLM) at ``pca_dims``."""
    start = distributed.writer_first(lambda: distilled(base_model, pca_dims, encoder_dir))
    # the context term's weight enters the key beside the config, only when set: the keys of the checkpoints
    # trained before the term existed stay what they were
    extra = {"context_weight": float(cfg.context_weight)} if cfg.context_weight > 0 else {}
    key = recipe_hash(kind="static-mnrl", pairs=pairs.digest(), config=replace(cfg, context_weight=0.0).key(),
                      start=folder_hash(start / "model"), precision="float64", **extra,
                      **distributed.world_key())
    out = Path(encoder_dir) / f"m2v-trained-{key[:16]}"
    # a damaged or unfinished one is moved aside and trained again (once: the writer checks first)
    if distributed.writer_first(lambda: reuse(out)) is not None:
        return out
    base = StaticModel.from_pretrained(str(start / "model"))
    table, info = train_static(pairs, cfg, base, log)
    if distributed.is_writer():  # under torchrun every rank holds the same table; rank 0 saves it
        with new_artifact(out, {"kind": "static-mnrl", "key": key}) as tmp:
            trained = StaticModel(table, base.tokenizer, config=base.config, normalize=True)
            trained.save_pretrained(str(tmp / "model"))
            (tmp / "source.json").write_text(json.dumps({"model": str(start), "name": out.name, "key": key}))
            ranks = distributed.world_size()
            write_json(tmp / "train_info.json", info | ({"world_size": ranks} if ranks > 1 else {}))
    distributed.barrier()
    return out
