"""The worker that tests/integration/learn/test_distributed.py runs, alone or under torchrun: trains a static
table on the tiny pairs from a tiny BERT's distillation and writes each rank's table, loss curve and the
checkpoint folder ``trained_static`` returns.

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

base, out = Path(sys.argv[1]), Path(sys.argv[2])
distributed.init_from_env()
start = distilled(base, 16, out / "enc")
pairs = training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), ContextRendering(join_users=True))
# 10 pairs in batches of 5 (an odd batch splits 3 + 2 over two ranks), both loss terms
cfg = TrainConfig(batch_size=5, lr=5e-2, warmup=0.0, epochs=4, max_seq_length=512, seed=0, context_weight=0.5)
table, info = train_static(pairs, cfg, StaticModel.from_pretrained(str(start / "model")))
r = distributed.rank()
np.save(out / f"table{r}.npy", table)
(out / f"loss{r}.json").write_text(json.dumps(info["loss"]))
(out / f"folder{r}.txt").write_text(str(trained_static(pairs, cfg, base, 16, out / "enc")))

# the gradient of one batch's ranking loss as the trainer takes it (AdamW hides its scale; this does not)
model = StaticModel.from_pretrained(str(start / "model"))
table = torch.nn.Parameter(torch.tensor(np.asarray(model.embedding, dtype=np.float32)))     # [V, d]
batch = next(iter(no_duplicate_batches(pairs, 5, 0)))
a, b = (distributed.gather_rows(lambda t: encode(table, model, t, 512), [col[i] for i in batch])
        for col in (pairs.anchors, pairs.positives))                                           # [B, d] each
loss = InBatchRanking(20.0)(EmbeddedBatch(a, b, unit=True))
(loss / distributed.world_size()).backward()
distributed.sum_gradients([table])
np.save(out / f"grad{r}.npy", table.grad.numpy())
