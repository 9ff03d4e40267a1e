"""The transformer trainer's context-to-context term (``TrainConfig.context_weight``), on the real MiniLM: its
loss recomputed exactly from the model, the partners shared with the static trainer, the recipe's key and
checks."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from builders import TINY_TOOLS, tiny_trajectories

from tracer.core.context import ContextRendering
from tracer.core.types import Registry
from tracer.encode.embedders import minilm_path
from tracer.learn.encoders import EncoderRecipe, TrainConfig
from tracer.learn.encoders.pairs import context_partners, no_duplicate_batches, training_pairs
from tracer.learn.encoders.transformer import checkpoint_dir, train

RENDERING = ContextRendering(join_users=True)
# a 2-layer student, a few dozen pairs: seconds on the CPU; lr 0, so every step's loss is the base model's
FROZEN = TrainConfig(batch_size=6, lr=0.0, warmup=0.0, epochs=2, max_seq_length=48, seed=0, layers=(4, 5),
                     context_weight=0.5)


def _pairs():
    return training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), RENDERING)


@pytest.fixture(scope="module")
def no_dropout(tmp_path_factory):
    """MiniLM with its dropout off (config.json edited, the weights copied): a training step is then the
    function of the weights that eval mode computes, so its loss can be recomputed exactly."""
    folder = tmp_path_factory.mktemp("minilm-no-dropout")
    shutil.copytree(minilm_path(), folder, dirs_exist_ok=True)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"hidden_dropout_prob": 0.0,
                                                          "attention_probs_dropout_prob": 0.0}))
    return folder


@pytest.mark.slow  # trains MiniLM twice with a term no preset's transformer recipe uses: make test-all
def test_each_step_adds_the_weighted_cross_entropy_of_anchors_against_their_partners(no_dropout):
    """Every step's loss is MNRL over the batch's (anchor, tool) pairs plus 0.5 x the cross-entropy of each
    anchor whose tool has another context against the batch's partner contexts (scale 20, cosines): recomputed
    from the untrained student with the partners drawn again each epoch (:func:`context_partners`, the static
    trainer's)."""
    from sentence_transformers import SentenceTransformer

    from tracer.learn.encoders.student import keep_layers

    pairs = _pairs()
    _, info = train(pairs, FROZEN, no_dropout, device="cpu")
    model = SentenceTransformer(str(no_dropout), device="cpu")
    keep_layers(model, FROZEN.layers)
    model.max_seq_length = FROZEN.max_seq_length

    def emb(texts):
        return model.encode(list(texts), convert_to_tensor=True, normalize_embeddings=True)  # [n, d]

    expected, with_partners = [], 0
    for epoch in range(FROZEN.epochs):
        partners = context_partners(pairs, FROZEN.seed + epoch)
        for batch in no_duplicate_batches(pairs, FROZEN.batch_size, FROZEN.seed + epoch):
            a = emb(pairs.anchors[i] for i in batch)                                            # [B, d]
            loss = F.cross_entropy(20 * a @ emb(pairs.positives[i] for i in batch).T,
                                   torch.arange(len(batch)))
            both = [(r, partners[i]) for r, i in enumerate(batch) if partners[i] is not None]
            if len(both) > 1:
                c = emb(pairs.anchors[j] for _, j in both)                                       # [B', d]
                loss = loss + 0.5 * F.cross_entropy(20 * a[[r for r, _ in both]] @ c.T,
                                                    torch.arange(len(both)))
                with_partners += 1
            expected.append(float(loss))
    assert with_partners >= 2 and len(info["loss"]) == len(expected)  # the term is in play on these pairs
    assert info["loss"] == pytest.approx(expected, abs=1e-4)
    _, plain = train(pairs, dataclasses.replace(FROZEN, context_weight=0.0), no_dropout, device="cpu")
    assert all(w >= p for w, p in zip(info["loss"], plain["loss"])) and info["loss"] != plain["loss"]


def test_the_weight_is_in_the_key_not_in_the_teacher_and_checked(tmp_path):
    """The weight enters the checkpoint's key only when set (recipes without it keep theirs); a student with
    it shares its teacher with the students without it; a recipe hands it to its TrainConfig."""
    pairs = _pairs()
    plain = dataclasses.replace(FROZEN, context_weight=0.0)
    assert FROZEN.key()["context_weight"] == 0.5 and "context_weight" not in plain.key()
    assert checkpoint_dir(pairs, FROZEN, None, tmp_path) != checkpoint_dir(pairs, plain, None, tmp_path)
    cut = dataclasses.replace(FROZEN, from_teacher=True)
    assert cut.teacher() == dataclasses.replace(plain, layers=()) and cut.teacher().context_weight == 0.0
    recipe = {**dataclasses.asdict(plain), "context_weight": 0.5, "encoder_dir": str(tmp_path)}
    assert EncoderRecipe.from_config(recipe).train == FROZEN
    with pytest.raises(ValueError, match="encoder_training.context_weight must be >= 0"):
        TrainConfig(context_weight=-1.0)
    with pytest.raises(ValueError, match="encoder_training.context_weight must be >= 0"):
        EncoderRecipe.from_config({**recipe, "context_weight": -0.5})
    assert not any(tmp_path.iterdir())  # nothing was trained or written by the checks
