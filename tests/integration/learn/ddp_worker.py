"""The worker that tests/integration/learn/test_distributed.py runs, alone or under torchrun: on the tiny
pairs, trains a static table (from the tiny BERT's distillation) and fine-tunes the tiny BERT, and writes each
rank's loss curves, weights and the checkpoint folders ``trained_static`` and ``finetuned`` return, and one
batch's summed gradient.

    python ddp_worker.py BASE_MODEL OUT_DIR TESTS_DIR
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from model2vec import StaticModel

sys.path.insert(0, sys.argv[3])  # tests/, for the builders
from builders import TINY_TOOLS, tiny_trajectories

from tracer.core.context import ContextRendering
from tracer.core.types import Registry
from tracer.encode.static import distilled
from tracer.learn import distributed
from tracer.learn.encoders import TrainConfig
from tracer.learn.encoders.losses import EmbeddedBatch, InBatchRanking
from tracer.learn.encoders.pairs import no_duplicate_batches, training_pairs
from tracer.learn.encoders.static import encode, train_static, trained_static
from tracer.learn.encoders.transformer import finetuned, train

base, out = Path(sys.argv[1]), Path(sys.argv[2])
distributed.init_from_env()
r = distributed.rank()
start = distributed.writer_first(lambda: distilled(base, 16, out / "enc"))
pairs = training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), ContextRendering(join_users=True))
# 10 pairs in batches of 5 (an odd batch splits 3 + 2 over two ranks), both loss terms
cfg = TrainConfig(batch_size=5, lr=5e-2, warmup=0.0, epochs=4, max_seq_length=512, seed=0, context_weight=0.5)
table, info = train_static(pairs, cfg, StaticModel.from_pretrained(str(start / "model")))
np.save(out / f"table{r}.npy", table)
(out / f"loss{r}.json").write_text(json.dumps(info["loss"]))
(out / f"folder{r}.txt").write_text(str(trained_static(pairs, cfg, base, 16, out / "enc")))

# the transformer: a warm-up and the partner column (a third column of its own length, split 1 + 1 or 2 + 1)
tcfg = TrainConfig(batch_size=5, lr=5e-3, warmup=0.25, epochs=2, max_seq_length=64, seed=0,
                   context_weight=0.5)
model, tinfo = train(pairs, tcfg, base, device="cpu")
(out / f"tloss{r}.json").write_text(json.dumps(tinfo["loss"]))
np.savez(out / f"weights{r}.npz", **{k: v.numpy() for k, v in model.state_dict().items()})
(out / f"tfolder{r}.txt").write_text(str(finetuned(pairs, tcfg, base, out / "enc", device="cpu")))

# one batch's gradient as the trainer takes it (AdamW hides its scale; this does not), with a one-row column
# whose shard is empty on rank 1
model = StaticModel.from_pretrained(str(start / "model"))
table = torch.nn.Parameter(torch.tensor(np.asarray(model.embedding, dtype=np.float32)))     # [V, d]
batch = next(iter(no_duplicate_batches(pairs, 5, 0)))
a, b, c = distributed.gather_columns(
    lambda cols: [encode(table, model, col, 512) for col in cols],
    [[pairs.anchors[i] for i in batch], [pairs.positives[i] for i in batch], [pairs.anchors[batch[0]]]],
    table.shape[1])                                                                    # [5, d] [5, d] [1, d]
loss = InBatchRanking(20.0)(EmbeddedBatch(a, b, unit=True)) + (c @ b.T).sum()
(loss / distributed.world_size()).backward()
distributed.sum_gradients([table])
np.save(out / f"grad{r}.npy", table.grad.numpy())
