"""Bounded work per input: text is clipped by characters before tokenizing
(tracer.encode.embedders.clip_texts), which changes no embedding of natural text, and the rule's one
documented limit; and no silent emptiness."""

from __future__ import annotations

import pytest
import torch
from builders import TINY_TOOLS, KeywordEmbedder, tiny_trajectories

from tracer.build import build_scorer
from tracer.core.types import Registry
from tracer.data import Dataset
from tracer.encode.embedders import CHARS_PER_PIECE, clip_texts
from tracer.eval.outputs import metrics_document
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.executors import OracleExecutor
from tracer.jobs.evaluate import summary_table
from tracer.scorer_base.resources import Resources

SENTENCES = ["Find me a flight from SFO to JFK tomorrow morning.",
             "Then book the cheapest one with a window seat.",
             "Email the confirmation to Bob and cancel the hotel.",
             "What is the weather like in Denver this week?"]


def test_clip_keeps_what_the_encoder_sees(minilm):
    model, limit = minilm.inner.model, minilm.inner.max_seq_length * CHARS_PER_PIECE
    long = " ".join(SENTENCES[i % 4] + f" ({i})" for i in range(700))          # ~38k characters of prose
    assert len(long) > 2 * limit and clip_texts([long, "short"], 256) == [long[:limit], "short"]
    whole = model.encode([long], convert_to_tensor=True, normalize_embeddings=True).float().cpu()
    torch.testing.assert_close(minilm.inner.encode([long]), whole, rtol=0, atol=0)


def test_the_clip_is_by_characters_not_word_pieces(minilm):
    """The documented limit: a text of mostly whitespace holds fewer word pieces than the clip assumes, and a
    word past the clip is not seen (it would be, tokenized whole)."""
    model, limit = minilm.inner.model, minilm.inner.max_seq_length * CHARS_PER_PIECE
    text = "flight" + " " * limit + "weather"
    whole = model.encode([text], convert_to_tensor=True, normalize_embeddings=True).float().cpu()
    head = model.encode(["flight"], convert_to_tensor=True, normalize_embeddings=True).float().cpu()
    torch.testing.assert_close(minilm.inner.encode([text]), head, rtol=0, atol=1e-6)
    assert not torch.allclose(whole, head, atol=1e-3)


# ---- no silent emptiness ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tracer_fixed", "tracer_plus", "autotool", "toolnet"])
def test_fitting_on_zero_training_steps_is_an_error(name):
    res = Resources.build(Registry(TINY_TOOLS), KeywordEmbedder(), device="cpu", seed=0)
    failed = [t.__class__(**{**t.__dict__, "success": False}) for t in tiny_trajectories()]
    with pytest.raises(ValueError,
                       match=r"no training steps: 5 trajectories \(0 successful, only successful ones"):
        build_scorer(name).fit(failed, res)


def test_a_fold_without_test_steps_is_reported():
    trajs = tiny_trajectories()
    ds = Dataset("tiny", Registry(TINY_TOOLS), tuple(trajs))
    res = Resources.build(ds.registry, KeywordEmbedder(), device="cpu", seed=0)
    cfg = EvalConfig(k=2, folds=2, seed=0, latency_sample=0, progress=False)
    fit_all = lambda: build_scorer("tracer_fixed", successful_only=False)
    fold_of = Evaluator(ds, fit_all, res, OracleExecutor(), cfg).fold_of
    # every trajectory of fold 1 failed: it still trains fold 0 (successful_only=False) but has nothing to
    # test
    ds = Dataset("tiny", ds.registry, tuple(t.__class__(**{**t.__dict__, "success": fold_of[t.group] == 0})
                                            for t in trajs))
    result = Evaluator(ds, fit_all, res, OracleExecutor(), cfg).run()
    doc = metrics_document(dataset="tiny", registry_size=6, scorer="tracer_fixed", k=2,
                           regime="teacher_forcing", executor="oracle", result=result)
    assert doc["folds"] == 2 and doc["folds_without_test_steps"] == [1]
    assert doc["folds_in_mean"]["recall_at_k"] == 1 and doc["per_fold"][1]["recall_at_k"] is None
    table = summary_table(doc)
    assert "mean ± SD over 2 folds" in table and "folds without test steps (in no mean): [1]" in table
    assert "recall_at_k" in table and "(over 1 of 2 folds)" in table
