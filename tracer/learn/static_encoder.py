"""A static encoder trained contrastively on logged trajectories: the fast encoder that learns.

Distilling a fine-tuned transformer into model2vec keeps none of what fine-tuning taught it (the
distillation reads each token out of context). Here the static model's token table itself is the
parameter: a text is the mean of its tokens' rows, L2-normalised, as model2vec encodes it, and the table
is trained with the same in-batch loss as the transformer (MultipleNegativesRankingLoss: cross-entropy
of each context over the batch's tool texts, cosine x ``scale``), starting from the model2vec
distillation of the base model. One epoch over a BFCL fold is seconds on one CPU thread.

With a ``teacher`` (a fine-tuned transformer checkpoint) the table is a *query* encoder instead: each context is
ranked against the teacher's frozen vectors of every registry tool, the table starts from the teacher's own
distillation at its full width (no PCA: the rows must live in the teacher's space), and the teacher embeds the
tools where it is served (:class:`tracer.encode.dual.DualEmbedder`). A live step then pays for a lookup and a mean
while the tool side keeps the transformer's quality, which is computed once per tool.

The result is saved atomically as a model2vec folder in ``<encoder_dir>/m2v-trained-<hash>/`` (the
layout :class:`tracer.encode.static.StaticEmbedder` loads), the hash covering the pairs, the recipe and
the starting table; a rerun loads it once it matches the manifest written with it (a damaged one is moved aside
and trained again, :mod:`tracer.encode.manifest`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from model2vec import StaticModel

from tracer.core.io import write_json
from tracer.encode.manifest import folder_hash, new_artifact, reuse
from tracer.encode.source import DEFAULT_CACHE, recipe_hash, source_hash
from tracer.encode.static import distilled
from tracer.learn.encoder import TrainConfig, unit_vectors
from tracer.learn.pairs import Pairs, context_partners, no_duplicate_batches, texts_digest


def _bags(model: StaticModel, texts: Sequence[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[T]`` of every text, concatenated, and each text's offset ``[B]`` (embedding_bag's input)."""
    ids, offsets = [], []
    for enc in model.tokenizer.encode_batch(list(texts), add_special_tokens=False):
        offsets.append(len(ids))
        ids.extend(enc.ids[:max_tokens] or [0])  # an empty text reads token 0 rather than an empty bag
    return torch.tensor(ids), torch.tensor(offsets)


def encode(table: torch.Tensor, model: StaticModel, texts: Sequence[str], max_tokens: int) -> torch.Tensor:
    """Mean of the tokens' rows, L2-normalised: ``[B, d]``."""
    return _mean_rows(table, *_bags(model, texts, max_tokens))


def _mean_rows(table: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return F.normalize(F.embedding_bag(ids, table, offsets, mode="mean"), dim=-1)              # [B, d]


def train_static(pairs: Pairs, cfg: TrainConfig, base: StaticModel, log: Callable[[dict], None] | None = None,
                 candidates: Sequence[str] | None = None, context_weight: float = 0.0,
                 fixed: torch.Tensor | None = None) -> tuple[np.ndarray, dict]:
    """The trained token table ``[V, d]`` and a summary (loss per step, wall time). AdamW at ``cfg.lr`` with
    no warm-up (a table of independent rows needs none), batches without a repeated anchor or tool.

    ``candidates``: None, in-batch negatives (each context against the batch's tool texts); else every
    tool text a context is ranked against (the registry's), re-encoded each batch, so each context's
    softmax is over the whole registry: the retrieval objective itself, affordable because a static
    encode of a few hundred tool texts is a lookup and a mean.

    ``fixed``: ``[N, d]``, frozen vectors of the distinct ``candidates`` in order (a teacher's): each context is ranked
    against those instead of re-encoded tool texts, so only the context side is trained (a query encoder).

    ``context_weight`` > 0 adds that weight times a second in-batch loss between contexts: each context
    against the batch's partner contexts, its positive being another context that called the same tool
    (:func:`context_partners`, drawn again each epoch; contexts whose tool has no other are left out of
    it). tracer_plus compares contexts with contexts (its edge and tool memories are mean contexts), which
    the context-to-tool loss alone does not train. A batch never holds a tool twice, so the other partners
    called other tools.
    """
    if len(pairs) < 2:
        raise ValueError(f"static encoder training needs at least 2 pairs, got {len(pairs)}")
    if candidates is not None:
        column = {t: i for i, t in enumerate(dict.fromkeys(candidates))}
        missing = sorted(set(pairs.positives) - column.keys())
        if missing:
            raise ValueError(f"{len(missing)} positive tool texts are not among the candidates, e.g. {missing[0][:80]!r}")
        # tokenised once, re-embedded every batch (unless their vectors are fixed)
        bags = _bags(base, list(column), cfg.max_seq_length) if fixed is None else None
    if fixed is not None and (candidates is None or tuple(fixed.shape) != (len(column), base.dim)):
        raise ValueError(f"static encoder training: fixed tool vectors must be [distinct candidates, table dim] = "
                         f"[{len(column) if candidates is not None else 'no candidates'}, {base.dim}], got "
                         f"{list(fixed.shape)}")
    torch.manual_seed(cfg.seed)
    table = torch.nn.Parameter(torch.tensor(np.asarray(base.embedding, dtype=np.float32)))   # [V, d]
    opt = torch.optim.AdamW([table], lr=cfg.lr, weight_decay=cfg.weight_decay)
    losses, t0, step = [], time.perf_counter(), 0
    for epoch in range(cfg.epochs):
        partners = context_partners(pairs, cfg.seed + epoch) if context_weight > 0 else None
        for batch in no_duplicate_batches(pairs, cfg.batch_size, cfg.seed + epoch):
            a = encode(table, base, [pairs.anchors[i] for i in batch], cfg.max_seq_length)     # [B, d]
            if candidates is None:
                p = encode(table, base, [pairs.positives[i] for i in batch], cfg.max_seq_length)  # [B, d]
                gold = torch.arange(len(batch))
            else:
                p = fixed if fixed is not None else _mean_rows(table, *bags)                       # [N, d]
                gold = torch.tensor([column[pairs.positives[i]] for i in batch])
            loss = F.cross_entropy(cfg.scale * a @ p.T, gold)                                   # a @ p.T: [B, B | N]
            if context_weight > 0:
                both = [(r, partners[i]) for r, i in enumerate(batch) if partners[i] is not None]
                if len(both) > 1:
                    rows = torch.tensor([r for r, _ in both])
                    c = encode(table, base, [pairs.anchors[j] for _, j in both], cfg.max_seq_length)  # [B', d]
                    loss = loss + context_weight * F.cross_entropy(cfg.scale * a[rows] @ c.T,      # [B', B']
                                                                   torch.arange(len(both)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if log is not None:
                log({"encoder/loss": losses[-1], "encoder/step": step})
            step += 1
    info = {"pairs": len(pairs), "batches": step, "train_seconds": round(time.perf_counter() - t0, 2),
            "loss": losses, "config": cfg.key(), "negatives": "in_batch" if candidates is None else len(column),
            "context_weight": context_weight, "fixed_tools": fixed is not None, "device": "cpu"}
    return table.detach().numpy(), info


def trained_static(pairs: Pairs, cfg: TrainConfig, base_model: str | Path | None = None, pca_dims: int = 256,
                   encoder_dir: str | Path = DEFAULT_CACHE, log: Callable[[dict], None] | None = None,
                   candidates: Sequence[str] | None = None, context_weight: float = 0.0,
                   teacher: str | Path | None = None) -> Path:
    """The trained static model folder for ``pairs``: trained and saved atomically on a miss, reused on a hit.
    It starts from the model2vec distillation of ``base_model`` (None: MiniLM) at ``pca_dims``;
    ``candidates`` and ``context_weight`` as :func:`train_static` (they enter the cache key).

    ``teacher``: a transformer checkpoint whose frozen vectors of the ``candidates`` each context is ranked against
    (a query encoder, served beside it); the table then starts from the teacher's distillation, ``pca_dims`` must be
    None (the teacher's width), and the teacher's folder enters the key and ``train_info.json``."""
    if teacher is not None and (pca_dims is not None or not candidates):
        raise ValueError(f"a static query encoder (teacher {teacher}) needs pca_dims None, so that its rows live in "
                         f"the teacher's space, and the candidate tool texts; got pca_dims {pca_dims}, "
                         f"{len(candidates or ())} candidates")
    start = distilled(teacher if teacher is not None else base_model, pca_dims, encoder_dir)
    extra = {} if candidates is None else {"candidates": texts_digest(candidates)}
    if context_weight > 0:
        extra["context_weight"] = float(context_weight)
    if teacher is not None:
        extra["teacher"] = source_hash(teacher)[1]
    key = recipe_hash(kind="static-mnrl", pairs=pairs.digest(), config=cfg.key(), start=folder_hash(start / "model"),
                      **extra)  # in-batch keys stay those of the runs already cached
    out = Path(encoder_dir) / f"m2v-trained-{key[:16]}"
    if reuse(out) is not None:  # a damaged or unfinished one is moved aside and trained again
        return out
    base = StaticModel.from_pretrained(str(start / "model"))
    fixed, meta = None, {}
    if teacher is not None:  # the tool side as the teacher serves it: its own truncation
        # the full package, imported here: only a query encoder needs it
        from sentence_transformers import SentenceTransformer

        t0 = time.perf_counter()
        net = SentenceTransformer(str(teacher), device="cpu")
        fixed = unit_vectors(net, (list(dict.fromkeys(candidates)),), net.max_seq_length)[0]       # [N, d]
        meta = {"teacher": str(teacher), "teacher_vectors_seconds": round(time.perf_counter() - t0, 2)}
    table, info = train_static(pairs, cfg, base, log, candidates, context_weight, fixed)
    with new_artifact(out, {"kind": "static-mnrl", "key": key}) as tmp:
        StaticModel(table, base.tokenizer, config=base.config, normalize=True).save_pretrained(str(tmp / "model"))
        (tmp / "source.json").write_text(json.dumps({"model": str(start), "name": out.name, "key": key}))
        write_json(tmp / "train_info.json", info | meta)
    return out
