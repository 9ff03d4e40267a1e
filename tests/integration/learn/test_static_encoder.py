"""The static encoder trained on trajectories (tracer/learn/encoders/static.py), on the real model2vec
distillation of MiniLM with its word pieces cut to 6,000 (conftest's ``minilm_small``)."""

from __future__ import annotations

import pytest
import torch
from builders import TINY_TOOLS, tiny_trajectories

from tracer.core.context import ContextRendering
from tracer.core.types import Registry
from tracer.encode.static import StaticEmbedder, distilled
from tracer.learn.encoders import TrainConfig, train_info, trained_static
from tracer.learn.encoders.pairs import training_pairs
from tracer.learn.encoders.static import encode

# a few dozen steps on 10 pairs: a high rate so that the trend shows (the real recipe:
# configs/encoder_training/static_mnrl.yaml)
CFG = TrainConfig(batch_size=6, lr=2e-2, warmup=0.0, epochs=10, max_seq_length=512, seed=0)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, minilm_small):
    """A fresh directory holding a link to the distillation of MiniLM with fewer word pieces
    (``minilm_small``, the base every test here trains from; built once in .cache/encoders)."""
    start = distilled(minilm_small).resolve()
    d = tmp_path_factory.mktemp("enc")
    (d / start.name).symlink_to(start)
    return d


def pairs():
    return training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), ContextRendering(join_users=True))


def test_training_lowers_the_loss_is_cached_and_serves_the_trained_table(encoder_dir, minilm_small):
    path = trained_static(pairs(), CFG, minilm_small, encoder_dir=encoder_dir)
    assert train_info(path)["batches"] > 0
    stamp = (path / "train_info.json").stat().st_mtime_ns
    assert trained_static(pairs(), CFG, minilm_small, encoder_dir=encoder_dir) == path       # a cache hit
    assert (path / "train_info.json").stat().st_mtime_ns == stamp
    # served as a model2vec folder: StaticEmbedder encodes with the trained table, as training did
    served = StaticEmbedder(model=str(path))
    texts = list(pairs().anchors) + [t.search_text for t in TINY_TOOLS]
    table = torch.tensor(served.model.embedding.astype("float32"))
    torch.testing.assert_close(served.encode(texts), encode(table, served.model, texts, 512), atol=1e-3,
                               rtol=0)
    # the trained table ranks each step's gold tool text first among the tools more often than where it
    # started
    start = StaticEmbedder(model=str(next(p for p in encoder_dir.iterdir() if p.is_symlink())))

    def nll_and_hits(emb):  # over the whole registry: the loss the training lowers, and top-1 hits
        q, t = emb.encode(list(pairs().anchors)), emb.encode([x.search_text for x in TINY_TOOLS])
        gold = torch.tensor([[x.search_text for x in TINY_TOOLS].index(p) for p in pairs().positives])
        logits = CFG.scale * q @ t.T                                                         # [P, N]
        return float(torch.nn.functional.cross_entropy(logits, gold)), int((logits.argmax(1) == gold).sum())

    (nll_after, hits_after), (nll_before, hits_before) = nll_and_hits(served), nll_and_hits(start)
    assert nll_after < 0.8 * nll_before and hits_after >= hits_before


def test_other_pairs_train_another_model(encoder_dir, minilm_small):
    one = trained_static(pairs(), CFG, minilm_small, encoder_dir=encoder_dir)
    fewer = training_pairs(tiny_trajectories()[1:], Registry(TINY_TOOLS), ContextRendering(join_users=True))
    assert trained_static(fewer, CFG, minilm_small, encoder_dir=encoder_dir) != one


@pytest.mark.slow  # trains encoders: make test-all
def test_context_positives_add_a_context_to_context_loss(encoder_dir, minilm_small):
    """``context_weight``: each batch's loss is the context-to-tool loss plus the weight times the
    cross-entropy of each context over the batch's partner contexts (another context that called the same
    tool), checked against a hand computation with the table frozen; partners share the tool and never the
    text; the weight enters the cache key beside the recipe's (the keys of checkpoints without it stay)."""
    from dataclasses import asdict, replace

    from model2vec import StaticModel

    from tracer.build import build_fold_encoders
    from tracer.learn.encoders.pairs import context_partners, no_duplicate_batches
    from tracer.learn.encoders.static import train_static

    p = pairs()
    partners = context_partners(p, 0)
    assert any(j is not None for j in partners)
    for i, j in enumerate(partners):
        others = [k for k in range(len(p))
                  if p.positives[k] == p.positives[i] and p.anchors[k] != p.anchors[i]]
        assert (j is None) == (not others) and (j is None or j in others)

    base = StaticModel.from_pretrained(str(next(x for x in encoder_dir.iterdir() if x.is_symlink())
                                           / "model"))
    frozen = replace(CFG, lr=0.0, epochs=1)
    _, info = train_static(p, replace(frozen, context_weight=0.5), base)
    table = torch.tensor(base.embedding.astype("float32"))
    ce = torch.nn.functional.cross_entropy
    expected = []
    for batch in no_duplicate_batches(p, frozen.batch_size, frozen.seed):
        a = encode(table, base, [p.anchors[i] for i in batch], 512)                             # [B, d]
        t = encode(table, base, [p.positives[i] for i in batch], 512)                           # [B, d]
        loss = ce(frozen.scale * a @ t.T, torch.arange(len(batch)))
        both = [(r, partners[i]) for r, i in enumerate(batch) if partners[i] is not None]
        if len(both) > 1:
            c = encode(table, base, [p.anchors[j] for _, j in both], 512)                       # [B', d]
            loss = loss + 0.5 * ce(frozen.scale * a[[r for r, _ in both]] @ c.T, torch.arange(len(both)))
        expected.append(float(loss))
    assert info["loss"] == pytest.approx(expected, abs=1e-5) and info["context_weight"] == 0.5
    assert expected != pytest.approx(train_static(p, frozen, base)[1]["loss"], abs=1e-5)  # the term is there

    trained = trained_static(p, replace(CFG, context_weight=0.5), minilm_small, encoder_dir=encoder_dir)
    assert trained != trained_static(p, CFG, minilm_small, encoder_dir=encoder_dir)  # another cache key
    assert train_info(trained)["config"] == CFG.key() and train_info(trained)["context_weight"] == 0.5
    cfg = {**asdict(CFG), "kind": "static", "context_weight": 0.5, "encoder_dir": str(encoder_dir),
           "context": {"join_users": True}, "base_model": str(minilm_small)}
    enc = build_fold_encoders(Registry(TINY_TOOLS), cfg, None)
    enc(tiny_trajectories())
    assert enc.history[-1]["checkpoint"] == str(trained)
    with pytest.raises(ValueError, match="context_weight must be >= 0"):
        build_fold_encoders(Registry(TINY_TOOLS), {**cfg, "context_weight": -0.5})


def test_encode_is_model2vecs_encode_bit_for_bit(encoder_dir, minilm_small):
    """``StaticEmbedder.encode`` runs model2vec's batch step without ``StaticModel.encode``'s batching
    (``_means``): the same bits, for texts of every length, a text cut at 512 tokens, one cut first at its
    characters, an empty one and one with no known token, one text at a time and all at once; and for an int8
    table and a weighted one."""
    import numpy as np
    from model2vec import StaticModel

    served = StaticEmbedder(model=str(trained_static(pairs(), CFG, minilm_small, encoder_dir=encoder_dir)))
    texts = (list(pairs().anchors) + [t.search_text for t in TINY_TOOLS]
             + ["", "\u2603\u2603", "list files " * 400, "a" * 5000, "ls", "cd into docs, then ls"])
    ref = StaticModel.encode(served.model, texts, use_multiprocessing=False).astype(np.float32)
    norms = np.linalg.norm(ref, axis=1, keepdims=True)
    expected = ref / np.where(norms > 0, norms, 1.0)
    np.testing.assert_array_equal(served.encode(texts).numpy(), expected)
    np.testing.assert_array_equal(np.concatenate([served.encode([t]).numpy() for t in texts]), expected)
    assert not expected[texts.index("")].any()

    int8 = StaticEmbedder(model=str(served.dir))
    int8.model.embedding = np.clip(np.round(int8.model.embedding * 400), -127, 127).astype(np.int8)
    ref = StaticModel.encode(int8.model, texts, use_multiprocessing=False)
    assert ref.dtype == np.float32 and np.abs(ref).max() > 0
    np.testing.assert_array_equal(int8._means(texts), ref)

    quantised = StaticEmbedder(model=str(served.dir))
    quantised.model.weights = np.linspace(0.5, 1.5, len(quantised.model.embedding)).astype(np.float32)
    ref = StaticModel.encode(quantised.model, texts[:5], use_multiprocessing=False)
    np.testing.assert_array_equal(quantised._means(texts[:5]), ref)
    assert not np.array_equal(ref, served._means(texts[:5]))  # the weights are read

