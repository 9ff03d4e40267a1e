"""Fast encoders (tracer/encode/onnx.py, static.py) against the real torch MiniLM, and their configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders import TINY_TOOLS

from tracer.build import build_embedder
from tracer.encode.embedders import CachedEmbedder

pytest.importorskip("onnxruntime")

# real texts: tool texts as the scorers embed them, rendered contexts, and one past 256 word pieces
# (truncation)
TEXTS = [t.search_text for t in TINY_TOOLS] + [
    "user: Find me a flight from SFO to JFK tomorrow and book it\nassistant: call search_flights",
    "user: What about now?",
    "user: Move 'final_report.pdf' into the temp folder, then sort its lines. " * 30,
    "",
]


@pytest.fixture(scope="module")
def torch_vectors(minilm):
    return minilm.encode(TEXTS)  # [N, 384]


@pytest.fixture(scope="module")
def onnx_fp32():
    from tracer.encode.onnx import OnnxEmbedder

    return OnnxEmbedder(variant="fp32")


@pytest.fixture(scope="module")
def onnx_int8():
    from tracer.encode.onnx import OnnxEmbedder

    return OnnxEmbedder(variant="int8")


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() * b.double()).sum(1)  # rows are unit vectors


@pytest.mark.heavy(seconds=20)
def test_onnx_fp32_equals_torch(onnx_fp32, torch_vectors):
    out = onnx_fp32.encode(TEXTS)
    assert out.dtype == torch.float32 and out.shape == torch_vectors.shape
    assert (1 - _cos(out, torch_vectors)).abs().max() < 1e-5
    torch.testing.assert_close(out.norm(dim=1), torch.ones(len(TEXTS)))


def test_onnx_fp32_batches_agree_with_single_texts(onnx_fp32):
    # padding in a batch must not change a text's fp32 embedding (mean pooling over the attention mask)
    from tracer.encode.onnx import OnnxEmbedder

    single = torch.cat([onnx_fp32.encode([t]) for t in TEXTS])
    batched = OnnxEmbedder(variant="fp32", batch_size=len(TEXTS))
    torch.testing.assert_close(batched.encode(TEXTS), single, atol=1e-5, rtol=0)
    assert batched.name == onnx_fp32.name  # the same vectors: one cache


def test_int8_encodes_each_text_alone_as_a_live_step_does(onnx_int8):
    """Dynamic int8 takes one activation scale per session run, so by default every text runs alone: a text's
    vector in a list is its vector by itself, bit for bit (what a live step computes, what the cache keeps
    under the text). Batched, it moves with its batch, and the embedder's name says it was batched."""
    from tracer.encode.onnx import OnnxEmbedder

    alone = torch.cat([onnx_int8.encode([t]) for t in TEXTS])
    assert onnx_int8.batch_size == 1 and torch.equal(onnx_int8.encode(TEXTS), alone)
    batched = OnnxEmbedder(variant="int8", batch_size=len(TEXTS))
    assert not torch.equal(batched.encode(TEXTS), alone)
    assert batched.name == onnx_int8.name.replace("-batch1", f"-batch{len(TEXTS)}") != onnx_int8.name
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            OnnxEmbedder(variant="int8", batch_size=bad)


def test_onnx_tokenizes_as_the_hugging_face_call(onnx_fp32):
    # the Rust tokenizer the encoder calls directly must give the wrapper's ids, mask and types exactly,
    # truncation at 256 and padding of a batch included
    import numpy as np

    ref = onnx_fp32.tokenizer(TEXTS, padding=True, truncation=True, max_length=onnx_fp32.max_seq_length,
                              return_tensors="np")
    enc = onnx_fp32.fast_tokenizer.encode_batch(TEXTS)
    assert ref["input_ids"].shape[1] == onnx_fp32.max_seq_length == 256
    for field, key in (("ids", "input_ids"), ("attention_mask", "attention_mask"),
                       ("type_ids", "token_type_ids")):
        np.testing.assert_array_equal(np.array([getattr(e, field) for e in enc]), ref[key])
    one = onnx_fp32.fast_tokenizer.encode_batch(TEXTS[:1])[0]
    assert one.ids == onnx_fp32.tokenizer(TEXTS[0])["input_ids"]  # alone: no padding


def test_onnx_int8_is_close_to_torch(onnx_int8, torch_vectors):
    cos = _cos(onnx_int8.encode(TEXTS), torch_vectors)
    assert cos.mean() > 0.98 and cos.min() > 0.95


def test_residual_layer_norms_stay_unfused(onnx_fp32, tmp_path):
    """The export keeps Add + LayerNormalization (its fused attention and GELU stay), and the embedder's
    session options do not fuse them back: ONNX Runtime's CPU SkipLayerNormalization is the slower of the
    two."""
    import onnx

    from tracer.encode.onnx import session

    for variant in ("fp32", "int8"):
        ops = {n.op_type for n in onnx.load(str(onnx_fp32.dir / f"{variant}.onnx")).graph.node}
        assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops, (variant, ops)
        assert {"Attention" if variant == "fp32" else "QAttention", "BiasGelu"} <= ops, (variant, ops)
    session(onnx_fp32.dir / "int8.onnx", save_optimized=tmp_path / "as_run.onnx")  # as OnnxEmbedder builds it
    ops = {n.op_type for n in onnx.load(str(tmp_path / "as_run.onnx")).graph.node}
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops, ops


def test_cache_keys_differ_by_variant_and_weights(onnx_fp32, onnx_int8, minilm, tmp_path):
    names = {minilm.name, onnx_fp32.name, onnx_int8.name}
    assert len(names) == 3
    # the export hash is in the name: same weights + recipe -> same name, so the cache is shared between runs
    assert onnx_fp32.name.rsplit("-", 1)[1] == onnx_int8.name.rsplit("-", 2)[1]
    dirs = {CachedEmbedder(e, tmp_path).cache_dir for e in (onnx_fp32, onnx_int8)}
    assert len(dirs) == 2


def test_embedder_configs_build_the_fast_encoders(tmp_path):
    from tracer.encode.onnx import OnnxEmbedder

    emb = build_embedder("onnx_int8", cache_dir=str(tmp_path))
    assert isinstance(emb, CachedEmbedder) and isinstance(emb.inner, OnnxEmbedder)
    assert "onnx-int8" in emb.name and emb.dim == 384
    emb.encode(TEXTS[:2])
    assert emb.n_encoded == 2 and list(emb.cache_dir.glob("*.npz"))


def test_onnx_rejects_an_unknown_variant():
    from tracer.encode.onnx import OnnxEmbedder

    with pytest.raises(ValueError, match="variant must be one of"):
        OnnxEmbedder(variant="fp16")


@pytest.mark.slow
def test_static_embedder_is_deterministic_and_normalised(minilm):
    """Distils MiniLM once into .cache/encoders (about 1.5 CPU-minutes cold; reused after)."""
    pytest.importorskip("model2vec")
    from tracer.encode.static import StaticEmbedder

    emb = StaticEmbedder()
    out = emb.encode(TEXTS)
    assert out.dtype == torch.float32 and out.shape == (len(TEXTS), 256) and emb.dim == 256
    norms = out.norm(dim=1)
    # every text has a known word piece except the empty one, which stays the zero vector
    torch.testing.assert_close(norms[:-1], torch.ones(len(TEXTS) - 1))
    assert norms[-1] == 0
    torch.testing.assert_close(torch.cat([emb.encode([t]) for t in TEXTS]), out, atol=0, rtol=0)
    assert StaticEmbedder().name == emb.name and "m2v" in emb.name and emb.name != minilm.name
    # a static model still ranks a tool's own text first among the tools
    tools = out[: len(TINY_TOOLS)]
    assert (tools @ tools.T).argmax(1).tolist() == list(range(len(TINY_TOOLS)))


def test_presets_compose():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path("configs").resolve()), version_base=None):
        assert compose("evaluate", overrides=["embedder=fast"]).embedder.variant == "int8"
        assert compose("evaluate").get("encoder_training") is None  # make demo does not train an encoder
        trained = compose("evaluate", overrides=["encoder_training=mnrl", "seed=3"]).encoder_training
        assert trained.seed == 3 and trained.context.join_users
        # the named presets: best fine-tunes MiniLM; fast a 3-layer student served in int8; fastest a static
        # model
        best = compose("evaluate", overrides=["experiment=preset/best"])
        assert best.scorer.name == "tracer_plus" and best.encoder_training.get("layers") is None
        fast = compose("evaluate", overrides=["experiment=preset/fast"])
        assert (list(fast.encoder_training.layers) == [0, 1, 5]
                and fast.encoder_training.serve_as.variant == "int8")
        fastest = compose("evaluate", overrides=["experiment=preset/fastest"])
        assert fastest.encoder_training.kind == "static" and fastest.encoder_training.inner_encoders
        assert fastest.encoder_training.context_weight == 0.5
