"""A static (model2vec) query encoder trained against a transformer teacher's frozen tool vectors and served beside
it (tracer/learn/static_encoder.py with ``teacher``, ``configs/encoder_training/static_query.yaml``), on the real
MiniLM and the real model2vec distillation."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
import torch
from builders import TINY_TOOLS, tiny_trajectories
from model2vec import StaticModel

from tracer.core.context import ContextRendering
from tracer.core.types import Registry
from tracer.encode.dual import DualEmbedder
from tracer.encode.embedders import SentenceTransformerEmbedder
from tracer.encode.static import StaticEmbedder, distilled
from tracer.eval.fold_encoders import FoldEncoders
from tracer.learn.encoder import TrainConfig, checkpoint_dir, train_info
from tracer.learn.pairs import no_duplicate_batches, training_pairs
from tracer.learn.static_encoder import encode, train_static, trained_static

TOOLS = [t.search_text for t in TINY_TOOLS]
# the table's recipe (a high rate over a few dozen steps, as test_static_encoder.py) and a 1-layer teacher: its
# distillation, the table's start, runs a sixth of MiniLM's (the real teacher is 6 layers, static_query.yaml)
CFG = TrainConfig(batch_size=6, lr=2e-2, warmup=0.0, epochs=10, max_seq_length=512, seed=0, fixed_tools=True)
TEACHER = TrainConfig(batch_size=6, lr=1e-4, warmup=0.1, epochs=2, max_seq_length=48, seed=0, layers=(5,))


def pairs():
    return training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), ContextRendering(join_users=True))


@pytest.fixture(scope="module")
def minilm_m2v(tmp_path_factory):
    """MiniLM's 256-dim distillation (built once in .cache/encoders)."""
    return StaticModel.from_pretrained(str(distilled() / "model"))


def test_fixed_vectors_replace_the_tool_side_of_the_loss(minilm_m2v):
    """``fixed``: each batch's loss is its contexts' cross-entropy over the frozen vectors (a hand computation with
    the table frozen), training lowers it, and the vectors must be one row per distinct candidate at the table's
    width."""
    base, p = minilm_m2v, pairs()
    table = torch.tensor(base.embedding.astype("float32"))
    fixed = encode(table, base, TOOLS, 512).roll(1, dims=1)        # [N, d] another space than the table's own tools
    frozen = replace(CFG, lr=0.0, epochs=1)
    _, info = train_static(p, frozen, base, candidates=TOOLS, fixed=fixed)
    expected = []
    for batch in no_duplicate_batches(p, frozen.batch_size, frozen.seed):
        q = encode(table, base, [p.anchors[i] for i in batch], 512)                               # [B, d]
        gold = torch.tensor([TOOLS.index(p.positives[i]) for i in batch])
        expected.append(float(torch.nn.functional.cross_entropy(frozen.scale * q @ fixed.T, gold)))
    assert info["loss"] == pytest.approx(expected, abs=1e-5) and info["fixed_tools"] is True
    assert expected != pytest.approx(train_static(p, frozen, base, candidates=TOOLS)[1]["loss"], abs=1e-5)
    trained, info = train_static(p, CFG, base, candidates=TOOLS, fixed=fixed)
    gold = torch.tensor([TOOLS.index(x) for x in p.positives])

    def nll(t: torch.Tensor) -> float:  # every context over the frozen vectors
        return float(torch.nn.functional.cross_entropy(CFG.scale * encode(t, base, p.anchors, 512) @ fixed.T, gold))

    assert nll(torch.from_numpy(trained)) < 0.5 * nll(table)
    assert torch.equal(fixed, encode(table, base, TOOLS, 512).roll(1, dims=1))                   # left as it was
    with pytest.raises(ValueError, match=r"fixed tool vectors must be \[distinct candidates, table dim\] = \[6, 256\], "
                                         r"got \[5, 256\]"):
        train_static(p, CFG, base, candidates=TOOLS, fixed=fixed[:5])
    with pytest.raises(ValueError, match="= \\[no candidates, 256\\]"):
        train_static(p, CFG, base, fixed=fixed)


@pytest.fixture(scope="module")
def enc_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("encoders")


def test_fold_encoders_serve_the_table_beside_its_teacher(enc_dir):
    """kind static with fixed_tools: the teacher (``teacher``'s recipe on the same pairs) is trained first; the table
    starts from the teacher's own distillation at its width, lands the contexts nearer their gold tools among the
    teacher's vectors than it started, is cached under a key naming the teacher, and is served as a DualEmbedder:
    contexts by the table, tools by the teacher. With inner_encoders, an inner fold's table is trained on the outer
    training data minus that fold beside the outer fold's teacher (no teacher is fine-tuned per inner fold)."""
    recipe = {**dataclasses.asdict(CFG), "kind": "static", "pca_dims": None, "encoder_dir": str(enc_dir),
              "context": {"join_users": True}, "device": "cpu", "teacher": dataclasses.asdict(TEACHER),
              "inner_encoders": True}
    encoders = FoldEncoders(Registry(TINY_TOOLS), recipe, embed_cache=None, device="cpu")
    train = tiny_trajectories()
    res = encoders(train)
    teacher = checkpoint_dir(pairs(), TEACHER, None, enc_dir)
    (record,) = encoders.history
    path = record["checkpoint"]
    assert record["teacher"] == str(teacher) == train_info(path)["teacher"]
    assert record["teacher_train_seconds"] == train_info(teacher)["train_seconds"] > 0
    dual = res.embedder.inner
    assert isinstance(dual, DualEmbedder) and isinstance(dual.query, StaticEmbedder) and dual.dim == 384
    assert dual.tools.name == str(teacher)
    served_tools = SentenceTransformerEmbedder(str(teacher), device="cpu", progress=0).encode(TOOLS)   # [N, d]
    torch.testing.assert_close(torch.from_numpy(res.tool_index.vectors), served_tools)
    anchors = list(pairs().anchors)
    torch.testing.assert_close(res.embedder.encode(anchors), StaticEmbedder(model=path).encode(anchors))
    gold = torch.tensor([TOOLS.index(x) for x in pairs().positives])

    def loss(query: StaticEmbedder) -> float:  # the objective, on the served embeddings
        return float(torch.nn.functional.cross_entropy(20 * query.encode(anchors) @ served_tools.T, gold))

    start = StaticEmbedder(model=str(distilled(teacher, None, enc_dir)))
    assert loss(StaticEmbedder(model=path)) < 0.5 * loss(start)
    assert str(trained_static(pairs(), CFG, None, None, enc_dir, candidates=TOOLS, teacher=teacher)) == path  # cached
    assert str(trained_static(pairs(), CFG, None, None, enc_dir, candidates=TOOLS[::-1] + ["x"],
                              teacher=teacher)) != path

    held = frozenset({train[0].group})
    inner = res.without(held)
    teachers = sorted(p.name for p in enc_dir.glob("finetuned-*"))
    assert teachers == [teacher.name]                                               # no teacher trained for it
    _, record = encoders.history
    assert (record["inner_of"], record["held_groups"], record["teacher"]) == (0, sorted(held), str(teacher))
    rest = training_pairs([t for t in train if t.group not in held], Registry(TINY_TOOLS),
                          ContextRendering(join_users=True))
    assert record["checkpoint"] == str(trained_static(rest, CFG, None, None, enc_dir, candidates=TOOLS,
                                                      teacher=teacher)) != path
    assert set(record["trajectory_ids"]) == {t.id for t in train if t.group not in held}
    assert inner.embedder.inner.tools.name == str(teacher)


def test_a_static_query_recipe_is_refused_without_what_it_needs(tmp_path):
    base = {**dataclasses.asdict(CFG), "kind": "static", "encoder_dir": str(tmp_path)}
    with pytest.raises(ValueError, match="needs teacher .* and pca_dims null .* got teacher None, pca_dims None"):
        FoldEncoders(Registry(TINY_TOOLS), {**base, "pca_dims": None}, embed_cache=None)
    with pytest.raises(ValueError, match="got teacher .*, pca_dims 256"):
        FoldEncoders(Registry(TINY_TOOLS), {**base, "teacher": {}}, embed_cache=None)
    with pytest.raises(ValueError, match="teacher names a static query encoder's teacher"):
        FoldEncoders(Registry(TINY_TOOLS), {**base, "fixed_tools": False, "teacher": {}}, embed_cache=None)
    with pytest.raises(ValueError, match="takes negatives in_batch"):
        FoldEncoders(Registry(TINY_TOOLS), {**base, "pca_dims": None, "teacher": {}, "negatives": "registry"})
    with pytest.raises(ValueError, match="needs pca_dims None, .* got pca_dims 256, 6 candidates"):
        trained_static(pairs(), CFG, encoder_dir=tmp_path, candidates=TOOLS, teacher=tmp_path)
