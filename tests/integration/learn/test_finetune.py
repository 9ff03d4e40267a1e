"""Encoder fine-tuning (tracer/learn/encoders/transformer.py) on the real MiniLM, and per-fold training
without leakage."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from builders import TINY_TOOLS, tiny_trajectories

from tracer.build import build_fold_encoders, build_scorer
from tracer.core.context import ContextRendering
from tracer.core.types import Registry
from tracer.data import Dataset
from tracer.encode.embedders import SentenceTransformerEmbedder
from tracer.eval.runner import EvalConfig, Evaluator
from tracer.executors.oracle import OracleExecutor
from tracer.learn.encoders import EncoderRecipe, TrainConfig, finetuned, train_info
from tracer.learn.encoders.pairs import Pairs, no_duplicate_batches, training_pairs
from tracer.learn.encoders.transformer import checkpoint_dir, train

RENDERING = ContextRendering(join_users=True)
# a few dozen pairs, short texts: seconds on the CPU. A high learning rate so that 4 epochs show a trend.
FAST = TrainConfig(batch_size=6, lr=1e-4, warmup=0.1, epochs=4, max_seq_length=48, seed=0)


def _pairs():
    return training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), RENDERING)


def test_pairs_are_rendered_contexts_and_tool_texts():
    pairs = _pairs()
    assert len(pairs) == 10  # t0: 2 steps, t1: 3, t2: 2, t3: 2, t4: 1
    # t1's third step: the request of the second turn, with the gold tool's text as the scorers embed it
    i = [j for j, t in enumerate(pairs.trajectory_ids) if t == "t1"][2]
    assert pairs.anchors[i] == "user: Actually cancel that booking"
    assert pairs.positives[i] == "cancel_booking: Cancel an existing booking by its id"
    failed = dataclasses.replace(tiny_trajectories()[4], success=False)
    assert "t4" not in training_pairs([failed], Registry(TINY_TOOLS), RENDERING).trajectory_ids


def test_batches_never_repeat_an_anchor_or_a_tool():
    pairs = _pairs()
    batches = no_duplicate_batches(pairs, 4, seed=0)
    for b in batches:
        assert len({pairs.anchors[i] for i in b}) == len(b) == len({pairs.positives[i] for i in b}) > 1
    used = [i for b in batches for i in b]
    assert len(used) == len(set(used))
    assert batches == no_duplicate_batches(pairs, 4, seed=0) != no_duplicate_batches(pairs, 4, seed=1)


@pytest.fixture(scope="module")
def trained():
    return train(_pairs(), FAST, device="cpu")


@pytest.mark.slow  # trains encoders: make test-all
def test_training_lowers_the_loss_and_is_deterministic(trained):
    _, info = trained
    per_epoch = torch.tensor(info["loss"]).view(FAST.epochs, -1).mean(1)  # [epochs]
    assert per_epoch[-1] < 0.7 * per_epoch[0]
    assert train(_pairs(), FAST, device="cpu")[1]["loss"] == info["loss"]


@pytest.mark.slow  # trains encoders: make test-all
def test_checkpoint_reloads_to_identical_embeddings_and_a_rerun_does_not_train(trained, tmp_path):
    model, info = trained
    calls = []
    path = finetuned(_pairs(), FAST, encoder_dir=tmp_path, device="cpu", log=calls.append)
    assert calls and train_info(path)["loss"] == info["loss"]
    texts = list(_pairs().anchors) + [t.search_text for t in TINY_TOOLS]
    want = model.encode(texts, convert_to_tensor=True, normalize_embeddings=True).cpu()
    got = SentenceTransformerEmbedder(str(path), device="cpu", progress=0).encode(texts)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # the cache hit: same folder, nothing trained (no loss logged), the files untouched
    stamp = (path / "train_info.json").stat().st_mtime_ns
    calls.clear()
    assert finetuned(_pairs(), FAST, encoder_dir=tmp_path, device="cpu", log=calls.append) == path
    assert calls == [] and (path / "train_info.json").stat().st_mtime_ns == stamp
    # another recipe or other pairs: another checkpoint
    assert checkpoint_dir(_pairs(), dataclasses.replace(FAST, epochs=1), None, tmp_path) != path
    assert checkpoint_dir(training_pairs(tiny_trajectories()[1:], Registry(TINY_TOOLS), RENDERING), FAST,
                          None, tmp_path) != path


@pytest.mark.slow  # trains an encoder per fold: make test-all (the inner folds' rule is checked fast below)
def test_per_fold_encoders_never_train_on_held_out_trajectories(tmp_path, tiny_resources):
    """Evaluate with per-fold fine-tuning: each fold's pairs come from its training trajectories only."""
    trajs = tiny_trajectories()
    ds = Dataset("tiny", Registry(TINY_TOOLS), tuple(trajs))
    cfg = {"context": {"join_users": True}, "encoder_dir": str(tmp_path / "enc"), "device": "cpu",
           **dataclasses.asdict(dataclasses.replace(FAST, epochs=1))}
    fold_encoders = build_fold_encoders(ds.registry, cfg, None, device="cpu")
    ecfg = EvalConfig(k=2, folds=2, seed=0, latency_sample=0, progress=False)
    ev = Evaluator(ds, lambda: build_scorer("vector"), tiny_resources, OracleExecutor(), ecfg,
                   fold_resources=fold_encoders)
    result = ev.run()
    assert result.n_steps == len(_pairs())
    per_fold = fold_encoders.history
    assert len(per_fold) == 2
    for fold, h in enumerate(per_fold):
        train, test = ev.split(fold)
        assert h["trajectory_ids"] and set(h["trajectory_ids"]) <= {t.id for t in train}
        assert not set(h["trajectory_ids"]) & {t.id for t in test}
        assert h["pairs"] == len(fold_encoders.pairs(train))
    assert per_fold[0]["checkpoint"] != per_fold[1]["checkpoint"]
    assert ev.res.embedder.name == per_fold[1]["checkpoint"]  # the last fold scored with its own encoder


@pytest.mark.slow  # trains encoders: make test-all
def test_a_fold_checkpoint_served_through_onnx_encodes_as_the_checkpoint(tmp_path):
    """``serve_as`` (encoder_training=mnrl_int8's mechanism): the fold's checkpoint is built into another
    embedder; here its ONNX fp32 export, which must encode as the fine-tuned torch model does."""
    pytest.importorskip("onnxruntime")
    from tracer.encode.onnx import OnnxEmbedder

    serve = {"_target_": "tracer.encode.onnx.OnnxEmbedder", "variant": "fp32", "threads": 1,
             "encoder_dir": str(tmp_path / "enc")}
    cfg = {"context": {"join_users": True}, "encoder_dir": str(tmp_path / "enc"), "device": "cpu",
           "serve_as": serve,
           **dataclasses.asdict(dataclasses.replace(FAST, epochs=1, layers=(5,)))}  # 1 layer: seconds
    res = build_fold_encoders(Registry(TINY_TOOLS), cfg, None, device="cpu")(tiny_trajectories())
    served = res.embedder.inner
    assert isinstance(served, OnnxEmbedder) and served.name.startswith("finetuned-")
    assert res.embedder.config == {**serve, "model": res.embedder.config["model"]}  # what a saved index keeps
    texts = list(_pairs().anchors) + [t.search_text for t in TINY_TOOLS]
    want = SentenceTransformerEmbedder(res.embedder.config["model"], device="cpu",
                                       progress=0).encode(texts)  # torch
    torch.testing.assert_close(served.encode(texts), want, atol=2e-5, rtol=0)


def test_pairs_of_several_datasets_concatenate_in_order():
    a, b = _pairs(), training_pairs(tiny_trajectories()[:2], Registry(TINY_TOOLS), RENDERING)
    both = Pairs.cat([a, b])
    assert len(both) == len(a) + len(b) and both.anchors[len(a):] == b.anchors
    assert both.trajectory_ids[: len(a)] == a.trajectory_ids and both.digest() != a.digest()


def test_inner_fold_encoders_never_saw_their_inner_fold(tmp_path, minilm_small):
    """inner_encoders: tracer_plus's candidate model is fitted on inner folds, each scored under an encoder
    fine-tuned without that fold's trajectories (the outer encoder saw them all). The static kind trains in
    milliseconds where the transformer takes seconds; which trainer runs is one branch of
    FoldEncoders.checkpoint, the leak logic (Resources.without, the held groups) is the same for both."""
    from tracer.encode.static import distilled

    start = distilled(minilm_small).resolve()  # built once in .cache/encoders; linked into a fresh folder
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / start.name).symlink_to(start)
    trajs = tiny_trajectories()
    cfg = {"context": {"join_users": True}, "encoder_dir": str(tmp_path / "enc"), "device": "cpu",
           "inner_encoders": True, "kind": "static", "base_model": str(minilm_small),
           **dataclasses.asdict(dataclasses.replace(FAST, epochs=1, lr=1e-2, max_seq_length=512))}
    fold_encoders = build_fold_encoders(Registry(TINY_TOOLS), cfg, None, device="cpu")
    res = fold_encoders(trajs)
    scorer = build_scorer("tracer_plus", head={"inner_folds": 3, "max_epochs": 5})
    scorer.fit(trajs, res)
    outer, *inner = fold_encoders.history
    assert outer["inner_of"] is None and len(inner) == 3 and fold_encoders.outer == [outer]
    assert {t.id for t in trajs} == set(outer["trajectory_ids"])
    held = [set(h["held_groups"]) for h in inner]
    assert set().union(*held) == {t.group for t in trajs} and sum(map(len, held)) == len(trajs)  # a partition
    group_of = {t.id: t.group for t in trajs}
    for h, groups in zip(inner, held):
        assert h["inner_of"] == 0 and h["trajectory_ids"]
        assert not {group_of[i] for i in h["trajectory_ids"]} & groups   # the fold it scores never reached it
        assert h["checkpoint"] != outer["checkpoint"]


@pytest.mark.slow  # trains encoders: make test-all
def test_a_shallower_student_keeps_the_chosen_layers_trains_and_reloads(tmp_path):
    """``layers``: the base model cut to some of its transformer layers (encoder_training=mnrl_l3_int8), then
    fine-tuned and saved as it is. The kept layers are the base's own weights in order, every other weight is
    untouched, keeping all six is the base model itself, and full-depth recipes keep their cache keys."""
    from sentence_transformers import SentenceTransformer

    from tracer.encode.embedders import minilm_path
    from tracer.learn.encoders.student import keep_layers

    texts = list(_pairs().anchors[:4]) + [t.search_text for t in TINY_TOOLS[:3]]
    full = SentenceTransformer(str(minilm_path()), device="cpu")
    cut = SentenceTransformer(str(minilm_path()), device="cpu")
    keep_layers(cut, (1, 4))
    want, got = full[0].auto_model.state_dict(), cut[0].auto_model.state_dict()
    for name, w in got.items():
        parts = name.split(".")
        if parts[:2] == ["encoder", "layer"]:
            # kept layer 0 is the base's layer 1, kept layer 1 its layer 4
            parts[2] = str((1, 4)[int(parts[2])])
        assert torch.equal(w, want[".".join(parts)]), name
    assert len(got) == len(want) - 4 * sum(n.startswith("encoder.layer.0.") for n in want)
    same = SentenceTransformer(str(minilm_path()), device="cpu")
    keep_layers(same, range(6))
    torch.testing.assert_close(same.encode(texts, convert_to_tensor=True),
                               full.encode(texts, convert_to_tensor=True), atol=0, rtol=0)
    with pytest.raises(ValueError, match="has 6 layers"):
        keep_layers(same, (2, 6))
    with pytest.raises(ValueError, match="distinct layer indices"):
        TrainConfig(layers=(1, 1))
    # fine-tuned and saved: two layers on disk, the same embeddings once reloaded, a checkpoint of its own
    recipe = dataclasses.replace(FAST, epochs=1, layers=[4, 1])  # a YAML list, in any order: the base's order
    assert recipe.layers == (1, 4) and recipe.key()["layers"] == [1, 4]
    path = finetuned(_pairs(), recipe, encoder_dir=tmp_path, device="cpu")
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 2
    assert train_info(path)["config"]["layers"] == [1, 4]
    reloaded = SentenceTransformerEmbedder(str(path), device="cpu", progress=0).encode(texts)
    model = SentenceTransformer(str(path), device="cpu")
    torch.testing.assert_close(reloaded,
                               model.encode(texts, convert_to_tensor=True, normalize_embeddings=True),
                               atol=1e-6, rtol=0)
    assert path != checkpoint_dir(_pairs(), dataclasses.replace(recipe, layers=()), None, tmp_path)
    # a full-depth recipe's key is what it was before the fields existed (no layers, cut or context term)
    assert FAST.key() == {k: v for k, v in dataclasses.asdict(FAST).items()
                          if k not in ("layers", "from_teacher", "context_weight")}
    with pytest.raises(ValueError, match="kind 'static' has no layers"):
        EncoderRecipe.from_config({"kind": "static", **dataclasses.asdict(recipe)})


@pytest.mark.slow  # trains encoders: make test-all
def test_a_student_cut_from_its_fine_tuned_teacher_starts_from_the_teachers_layers(tmp_path):
    """``from_teacher``: the student's layers come from the full-depth recipe fine-tuned on the same pairs
    (trained first, recorded as its ``teacher``), not from the base model; it then trains as usual, and has
    its own key."""
    from sentence_transformers import SentenceTransformer

    from tracer.encode.embedders import minilm_path

    pairs = _pairs()
    student = dataclasses.replace(FAST, epochs=1, layers=(4, 5))
    cut = dataclasses.replace(student, from_teacher=True)
    path = finetuned(pairs, cut, encoder_dir=tmp_path, device="cpu")
    teacher = checkpoint_dir(pairs, cut.teacher(), None, tmp_path)
    assert (cut.teacher() == dataclasses.replace(student, layers=())
            and train_info(path)["teacher"] == str(teacher))
    assert (train_info(path)["config"]["from_teacher"] is True and cut.needs_teacher
            and not student.needs_teacher)
    assert cut.key()["from_teacher"] is True and path != checkpoint_dir(pairs, student, None, tmp_path)

    def layer(folder, i):  # the query projection of transformer layer i, [d, d]
        return (SentenceTransformer(str(folder), device="cpu")[0].auto_model.encoder.layer[i]
                .attention.self.query.weight.detach())

    # against the same student cut from the base model: nearer the teacher's layer, further from the base's
    fine, base = layer(teacher, 4), layer(minilm_path(), 4)
    gap = {(name, ref): float((layer(p, 0) - w).norm()) for name, p in (("cut", path),
           ("base-cut", finetuned(pairs, student, encoder_dir=tmp_path, device="cpu")))
           for ref, w in (("teacher", fine), ("base", base))}
    # 0.047 against 0.065 both ways (seeded, CPU-deterministic): each student stays near where it started
    assert gap["cut", "teacher"] < 0.8 * gap["base-cut", "teacher"], gap
    assert gap["cut", "base"] > 1.25 * gap["base-cut", "base"], gap
    with pytest.raises(ValueError, match="from_teacher cuts a student from its full-size teacher"):
        TrainConfig(from_teacher=True)


def test_per_fold_encoders_read_tools_as_their_base_model_was_trained_to(tmp_path):
    """A base that records ``tool_text: parameters`` (the general encoder) is fine-tuned on pairs whose tool
    texts carry the parameters, and its fold checkpoints record it, so they serve the same reading."""
    from tracer.core.tool_text import tool_text

    one_layer = dataclasses.replace(FAST, epochs=1, layers=(5,))
    base = finetuned(_pairs(), one_layer, None, tmp_path / "base", "cpu", record={"tool_text": "parameters"})
    registry = Registry([dataclasses.replace(t, parameters={"type": "object", "properties": {
        "when": {"description": f"when to {t.name}"}}}) for t in TINY_TOOLS])
    cfg = {"context": {"join_users": True}, "encoder_dir": str(tmp_path / "enc"), "device": "cpu",
           "base_model": str(base), **dataclasses.asdict(dataclasses.replace(FAST, epochs=1))}
    folds = build_fold_encoders(registry, cfg, None, device="cpu")
    pairs = folds.pairs(tiny_trajectories())
    assert folds.tool_text == "parameters" and all(" | when: when to " in p for p in pairs.positives)
    res = folds(tiny_trajectories())
    assert train_info(folds.history[-1]["checkpoint"])["tool_text"] == "parameters"
    assert res.embedder.tool_text == "parameters"
    want = res.embedder.encode([tool_text(t, "parameters") for t in registry])  # [N, d]
    torch.testing.assert_close(torch.from_numpy(res.tool_index.vectors), want, atol=1e-5, rtol=0)
    plain = build_fold_encoders(registry, {**cfg, "base_model": None}, None, device="cpu")
    assert plain.tool_text == "name_description"
    assert plain.pairs(tiny_trajectories()).positives == _pairs().positives  # MiniLM's pairs as before
