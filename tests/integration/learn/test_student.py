"""Narrowing a student's feed-forward blocks (tracer/learn/student.py) on the real MiniLM, trained and served."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from builders import TINY_TOOLS, tiny_trajectories

from tracer.core.context import ContextRendering
from tracer.core.types import Registry
from tracer.encode.embedders import minilm_path
from tracer.encode.onnx import OnnxEmbedder
from tracer.eval.fold_encoders import FoldEncoders
from tracer.learn.encoder import STUDENT_FIELDS, TrainConfig, checkpoint_dir, finetuned, train_info
from tracer.learn.pairs import training_pairs
from tracer.learn.student import ffn_importance, keep_layers, narrow_ffn, slice_ffn

RENDERING = ContextRendering(join_users=True)
FAST = TrainConfig(batch_size=6, lr=1e-4, warmup=0.1, epochs=1, max_seq_length=48, seed=0)


def _pairs():
    return training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), RENDERING)


def _model():
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(minilm_path()), device="cpu")


def _texts():
    pairs = _pairs()
    return sorted(set(pairs.anchors) | set(pairs.positives))


def _vecs(model, texts):
    return model.encode(texts, convert_to_tensor=True, normalize_embeddings=True)   # [N, d]


def test_narrowing_keeps_the_neurons_that_matter_and_full_width_is_the_same_model():
    """The neurons kept are those that matter: narrowed to half its width by importance, the model's embeddings
    stay closer to the full model's than with half its neurons drawn at random, and those closer than with its
    least important half; narrowed to its full width, it is the full model to the last bit."""
    texts = _texts()
    full = _vecs(_model(), texts)
    same = _model()
    narrow_ffn(same, 1536, texts)
    torch.testing.assert_close(_vecs(same, texts), full, atol=0, rtol=0)
    imp = ffn_importance(_model(), texts)                                          # [1536] per layer
    assert len(imp) == 6 and all(v.shape == (1536,) and bool((v >= 0).all()) for v in imp)
    gen = torch.Generator().manual_seed(0)
    keep = {"most": [v.topk(768).indices.sort().values for v in imp],
            "random": [torch.randperm(1536, generator=gen)[:768].sort().values for _ in imp],
            "least": [v.topk(768, largest=False).indices.sort().values for v in imp]}
    cos = {}
    for order, idx in keep.items():
        model = _model()
        slice_ffn(model, idx)
        assert model[0].auto_model.config.intermediate_size == 768
        cos[order] = float((_vecs(model, texts) * full).sum(1).mean())
    narrowed = _model()
    narrow_ffn(narrowed, 768, texts)                                               # = the "most" slicing
    assert float((_vecs(narrowed, texts) * full).sum(1).mean()) == pytest.approx(cos["most"], abs=1e-6)
    assert cos["most"] > cos["random"] + 0.05 > cos["least"] + 0.1, cos          # 0.82, 0.73, 0.62
    with pytest.raises(ValueError, match="encoder_training.ffn must be between 1 and the model's feed-forward width 1536"):
        narrow_ffn(_model(), 2000, texts)
    with pytest.raises(ValueError, match="no texts"):
        narrow_ffn(_model(), 10, [])
    with pytest.raises(ValueError, match="one equally long index set per layer"):
        slice_ffn(_model(), [torch.arange(4)] * 5 + [torch.arange(3)])


def test_a_narrow_student_cut_from_its_teacher_trains_saves_and_serves_in_onnx(tmp_path):
    """``ffn`` with ``layers`` and ``from_teacher``: the student is the fine-tuned teacher's layers, narrowed, then
    fine-tuned; on disk a plain checkpoint of that width (two layers, 96 neurons), which sentence-transformers and
    the ONNX export load as they are (fp32: the torch embeddings), under a cache key of its own."""
    from sentence_transformers import SentenceTransformer

    pairs = _pairs()
    recipe = dataclasses.replace(FAST, layers=(4, 5), ffn=96, from_teacher=True)
    path = finetuned(pairs, recipe, encoder_dir=tmp_path, device="cpu")
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["intermediate_size"]) == (2, 96)
    info = train_info(path)
    assert info["config"]["ffn"] == 96 and info["teacher"] == str(checkpoint_dir(pairs, recipe.teacher(), None, tmp_path))
    assert recipe.teacher() == dataclasses.replace(FAST) and recipe.student and not FAST.student
    assert path != checkpoint_dir(pairs, dataclasses.replace(recipe, ffn=0), None, tmp_path)
    # the student started from the teacher's layers 4 and 5, narrowed to the 96 neurons that matter most on the
    # pairs' texts once cut: each of its feed-forward rows is the teacher's row of that neuron, in order, moved by
    # one epoch only
    cut = SentenceTransformer(info["teacher"], device="cpu")
    keep_layers(cut, recipe.layers)
    want = [v.topk(96).indices.sort().values for v in ffn_importance(cut, _texts())]      # [96] per layer
    student = SentenceTransformer(str(path), device="cpu")[0].auto_model.encoder.layer
    for i, layer in enumerate(cut[0].auto_model.encoder.layer):
        up_t, up_s = layer.intermediate.dense.weight.detach(), student[i].intermediate.dense.weight.detach()
        dist = torch.cdist(up_s, up_t)                                                     # [96, 1536]
        assert torch.equal(dist.argmin(1), want[i])
        assert float(dist.min(1).values.max()) < 0.05 * float(up_t.norm(dim=1).min())
    texts = _texts()
    torch_vecs = _vecs(SentenceTransformer(str(path), device="cpu"), texts)
    onnx_vecs = OnnxEmbedder(str(path), "fp32", encoder_dir=tmp_path).encode(texts)
    assert float((torch_vecs * onnx_vecs).sum(1).min()) > 0.99999
    int8 = OnnxEmbedder(str(path), "int8", encoder_dir=tmp_path).encode(texts)
    assert float((torch_vecs * int8).sum(1).mean()) > 0.98


def test_ffn_is_a_student_field_checked_before_training():
    assert "ffn" in STUDENT_FIELDS and "ffn" not in FAST.key()
    assert dataclasses.replace(FAST, ffn=384).key()["ffn"] == 384
    with pytest.raises(ValueError, match="encoder_training.ffn must be >= 0"):
        TrainConfig(ffn=-1)
    TrainConfig(ffn=384, distill=1.0)  # a narrower full-depth model is a student too
    with pytest.raises(ValueError, match="kind 'static' has no layers"):
        FoldEncoders(Registry(TINY_TOOLS), {"kind": "static", "ffn": 384}, embed_cache=None)
    not_bert = torch.nn.Module()
    not_bert.auto_model = torch.nn.Linear(2, 2)  # a model without an encoder.layer stack
    with pytest.raises(TypeError, match="encoder_training.layers: the base model \\(Linear\\) has no BERT-style"):
        keep_layers([not_bert], (0,))
