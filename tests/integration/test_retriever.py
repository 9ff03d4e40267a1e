"""The plain-Python facade: steps from live messages, build from a dataset directory with the real
MiniLM and FAISS, select / rank / batch, save and load."""

from __future__ import annotations

import json

import pytest
from builders import cascade_retriever

from tracer.core.errors import DataError
from tracer.core.steps import extract_all
from tracer.core.types import Trajectory
from tracer.data import write_native
from tracer.retriever import Retriever, saveable_scorers, step_from_messages


# ---- steps from live messages ------------------------------------------------------------------------
def test_step_from_messages_matches_extract_steps_on_bfcl():
    from tracer.data import load_dataset

    steps = load_dataset("bfcl", execute=False).steps()
    for s in steps:
        live = step_from_messages(s.context)
        assert (live.prefix, live.history, live.turn, live.position, live.index) == \
            (s.prefix, s.history, s.turn, s.position, s.index)
        assert live.context == s.context and live.gold == ""


def test_step_from_messages_with_parallel_calls_and_no_user_message():
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
             for i, n in enumerate(["a", "b", "c"])]
    msgs = ({"role": "system", "content": "s"},
            {"role": "assistant", "content": None, "tool_calls": calls[:1]},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "ok", "tool_calls": calls[1:]})
    steps = extract_all([Trajectory("p", "p", "x", msgs)])
    assert [s.gold for s in steps] == ["a", "b", "c"]
    for s in steps:  # the context of a parallel call holds the earlier calls of its message
        live = step_from_messages(s.context)
        assert ((live.prefix, live.history, live.turn, live.position)
                == (s.prefix, s.history, s.turn, s.position))
    assert step_from_messages([]).prefix == () and step_from_messages([]).turn == 0


# ---- the facade with MiniLM ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from builders import TINY_TOOLS, tiny_trajectories

    from tracer.core.types import Registry

    path = tmp_path_factory.mktemp("tiny") / "dataset"
    write_native(path, Registry(TINY_TOOLS), tiny_trajectories())
    return path


@pytest.fixture(scope="module")
def retriever(tiny_dir, minilm):
    return Retriever.from_dataset(tiny_dir, "tracer_fixed", embedder=minilm, device="cpu")


def conversation(*calls: str, request: str = "Find a flight from SFO to JFK and book it") -> list[dict]:
    msgs = [{"role": "user", "content": request}]
    for i, name in enumerate(calls):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps({})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok"})
    return msgs


def test_select_returns_openai_tool_objects(retriever):
    tools = retriever.select(conversation("search_flights"), k=3)
    assert len(tools) == 3 and all(t["type"] == "function" and "parameters" in t["function"] for t in tools)
    assert tools[0]["function"]["name"] == "book_flight"  # the only child of (search_flights,), kappa = 1
    assert tools == [retriever.registry.get(t["function"]["name"]).to_openai() for t in tools]
    assert len(retriever.select(conversation())) == retriever.k == 5


def test_rank_is_the_whole_registry_and_agrees_with_select(retriever):
    for msgs in (conversation(), conversation("search_flights"),
                 conversation("get_weather", request="weather?")):
        names = retriever.rank(msgs)
        assert sorted(names) == sorted(retriever.registry.names)
        assert [t["function"]["name"] for t in retriever.select(msgs, k=4)] == names[:4]


def test_select_batch_equals_select(retriever):
    convs = [conversation(), conversation("search_flights"), conversation("list_files", request="files")]
    assert retriever.select_batch(convs, k=2) == [retriever.select(c, k=2) for c in convs]


def test_save_and_load_give_identical_answers(retriever, minilm, tmp_path):
    retriever.save(tmp_path / "index")
    again = Retriever.load(tmp_path / "index", embedder=minilm, device="cpu")
    for msgs in (conversation(), conversation("search_flights"),
                 conversation("book_flight", request="cancel it")):
        assert again.rank(msgs) == retriever.rank(msgs)
        assert again.select(msgs, k=3) == retriever.select(msgs, k=3)


class OtherEmbedder:
    def __init__(self, name: str, dim: int):
        self.name, self.dim = name, dim

    def encode(self, texts):
        raise AssertionError("never used")


def test_load_refuses_another_embedder(retriever, tmp_path):
    retriever.save(tmp_path / "index")
    with pytest.raises(ValueError, match="built with embedder 'all-MiniLM-L6-v2' \\(dim 384\\), not 'other'"):
        Retriever.load(tmp_path / "index", embedder=OtherEmbedder("other", 384))
    with pytest.raises(ValueError, match="not 'all-MiniLM-L6-v2' \\(dim 256\\)"):
        Retriever.load(tmp_path / "index", embedder=OtherEmbedder("all-MiniLM-L6-v2", 256))
    with pytest.raises(FileNotFoundError, match="no saved index"):
        Retriever.load(tmp_path / "elsewhere", embedder=OtherEmbedder("other", 384))


def test_scorers_without_save_select_but_refuse_to_save(tiny_dir, minilm, tmp_path):
    vector = Retriever.from_dataset(tiny_dir, "vector", embedder=minilm, device="cpu")
    assert vector.select(conversation(request="what's the weather in Paris"), k=1)[0]["function"]["name"] == \
        "get_weather"
    refused = (r"scorer 'vector' \(VectorScorer\) cannot be saved: only scorers with can_save can "
               r"\(cascade, tracer, tracer_fixed, tracer_g, tracer_plus\)")
    with pytest.raises(TypeError, match=refused):
        vector.save(tmp_path / "index")


def test_the_scorers_that_save_are_read_off_their_classes():
    """Every scorer config whose class declares can_save (the tracer family and the cascade over
    tracer_plus), none other."""
    assert saveable_scorers() == ["cascade", "tracer", "tracer_fixed", "tracer_g", "tracer_plus"]


def test_from_dataset_refuses_what_is_not_a_dataset(minilm, tmp_path):
    with pytest.raises(DataError, match="neither a dataset directory"):
        Retriever.from_dataset(tmp_path / "missing", embedder=minilm)


def test_default_scorer_is_tracer_plus_and_round_trips(tiny_dir, minilm, tmp_path):
    r = Retriever.from_dataset(tiny_dir, embedder=minilm, device="cpu")
    assert r.scorer.name == "tracer_plus"
    msgs = conversation("search_flights")
    before = r.rank(msgs)
    assert sorted(before) == sorted(t.name for t in r.registry) and len(r.select(msgs, k=2)) == 2
    r.save(tmp_path / "plus")
    loaded = Retriever.load(tmp_path / "plus", embedder=minilm)
    assert loaded.scorer.name == "tracer_plus" and loaded.rank(msgs) == before


def test_a_trial_conversation_is_shown_the_other_ranking_too(tiny_dir, minilm):
    from tracer.scorer_base.trial import on_trial, widened

    r = Retriever.from_dataset(tiny_dir, embedder=minilm, device="cpu", zero_shot={"trial": 0.5})
    assert r.scorer.trial_ready   # a trained model the guard judged: two rankings to try
    msgs = conversation("search_flights")
    plain = r.select_ids(msgs, k=2)
    step = r.read(msgs).step
    other = r.scorer.trial_rankings([step], 2)[0]
    ids = [f"conversation-{i}" for i in range(40)]
    assert [r.is_trial(c) for c in ids] == [on_trial(c, 0.5, r.scorer.res.seed) for c in ids]
    trial = next(c for c in ids if r.is_trial(c))
    assert len(widened(plain, other, 2)) == 3   # the rankings differ here: one more tool on a trial
    assert r.select_ids(msgs, k=2, conversation=trial) == tuple(widened(plain, other, 2))
    assert r.select_ids(msgs, k=2, conversation=next(c for c in ids if not r.is_trial(c))) == plain
    assert [t["function"]["name"] for t in r.select(msgs, k=2, conversation=trial)] == [
        r.registry.names[i] for i in widened(plain, other, 2)]


@pytest.mark.heavy(seconds=10)
def test_an_index_with_a_fine_tuned_encoder_loads_it_back_by_itself(tiny_dir, tmp_path, tiny_bert_dir):
    """from_dataset(encoder_training=...) fine-tunes on the dataset first; the saved index keeps the encoder's
    config, so load rebuilds it without being handed an embedder (what `tracer serve --index` needs). The base
    is the tiny BERT: what is kept and rebuilt is the same for MiniLM's fine-tuning, at a fraction of the
    cost."""
    recipe = {"context": {"join_users": True}, "successful_only": True, "base_model": str(tiny_bert_dir),
              "device": "cpu",
              "encoder_dir": str(tmp_path / "enc"), "batch_size": 6, "lr": 1e-4, "warmup": 0.1,
              "weight_decay": 0.0, "epochs": 1, "scale": 20.0, "max_seq_length": 48, "seed": 0}
    r = Retriever.from_dataset(tiny_dir, "tracer_fixed", device="cpu", cache_dir=None,
                               encoder_training=recipe)
    assert r.res.embedder.name.startswith(str(tmp_path / "enc" / "finetuned-"))
    r.save(tmp_path / "index")
    again = Retriever.load(tmp_path / "index", device="cpu", cache_dir=None)
    assert again.res.embedder.name == r.res.embedder.name
    for msgs in (conversation(), conversation("search_flights"), conversation("list_files", request="files")):
        assert again.rank(msgs) == r.rank(msgs)
    with pytest.raises(ValueError, match="pass embedder or encoder_training, not both"):
        Retriever.from_dataset(tiny_dir, embedder=r.res.embedder, encoder_training=recipe)


def test_a_preset_builds_what_train_py_builds(tiny_dir, tmp_path, monkeypatch):
    """from_dataset(preset=NAME) takes the preset file's scorer, embedder and recipe with its own keys merged
    in (the shipped presets against Hydra's composition: tests/unit/configs/test_presets.py); keyword
    overrides still reach its scorer. A preset of our own, beside the shipped configs, so nothing trains."""
    import tracer.build as build_module

    for entry in build_module.CONFIG_DIR.iterdir():  # train.yaml and the groups it composes
        if entry.name != "experiment":
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "experiment" / "preset").mkdir(parents=True)
    (tmp_path / "experiment" / "preset" / "fixed.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /scorer: tracer_fixed\n  - override /embedder: minilm\n"
        "  - override /encoder_training: null\nscorer:\n  tau: 0.35\n")
    monkeypatch.setattr(build_module, "CONFIG_DIR", tmp_path)
    preset = Retriever.from_dataset(tiny_dir, preset="fixed", device="cpu", cache_dir=None)
    by_hand = Retriever.from_dataset(tiny_dir, "tracer_fixed", device="cpu", cache_dir=None, tau=0.35)
    assert preset.scorer.name == "tracer_fixed" and preset.scorer.config() == by_hand.scorer.config()
    assert preset.scorer.config() != Retriever.from_dataset(tiny_dir, "tracer_fixed", device="cpu",
                                                            cache_dir=None).scorer.config()   # tau 0.2
    for msgs in (conversation(), conversation("search_flights"), conversation("list_files", request="files")):
        assert preset.rank(msgs) == by_hand.rank(msgs)
    again = Retriever.from_dataset(tiny_dir, preset="fixed", device="cpu", cache_dir=None, tau=0.5)
    assert again.scorer.config() == Retriever.from_dataset(tiny_dir, "tracer_fixed", device="cpu",
                                                           cache_dir=None, tau=0.5).scorer.config()
    with pytest.raises(ValueError, match="preset chooses the scorer, embedder and encoder_training"):
        Retriever.from_dataset(tiny_dir, "tracer_fixed", preset="fixed")
    with pytest.raises(KeyError, match="unknown preset 'bset'; valid names: fixed"):
        Retriever.from_dataset(tiny_dir, preset="bset")


def test_a_saved_embedder_config_may_only_name_a_tracer_encoder(retriever, tmp_path):
    from tracer.scorer_base.persist import read_meta

    retriever.save(tmp_path / "index")
    meta_path = next((tmp_path / "index").rglob("meta.json"))
    meta = json.loads(meta_path.read_text())
    dual = "tracer.encode.dual.DualEmbedder"
    st = {"_target_": "tracer.encode.embedders.SentenceTransformerEmbedder", "model": None}
    for bad in ({"_target_": "os.system", "command": "echo pwned"},
                {"_target_": dual, "query": st, "tools": {"_target_": "os.system", "command": "echo pwned"}},
                {"_target_": dual, "query": st,
                 "tools": [{"_target_": "os.system", "command": "echo pwned"}]}):
        meta["embedder"]["config"] = bad
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(DataError, match="embedder.config"):
            read_meta(meta_path)
    # nested encoders of tracer.encode
    meta["embedder"]["config"] = {"_target_": dual, "query": st, "tools": st}
    meta_path.write_text(json.dumps(meta))
    assert read_meta(meta_path)["embedder"]["config"]["tools"] == st


@pytest.mark.slow  # trains encoders / a W&B run: make test-all
def test_a_cascade_with_two_trained_encoders_saves_and_loads_both_by_itself(tiny_dir, tmp_path, minilm_small):
    """A cascade (scorer=cascade, encoder_training=cascade's mechanism): a static table for the fast stage and
    a fine-tuned MiniLM for the slow one, both trained on the dataset; the saved index keeps both encoders'
    configs, so load rebuilds the two (what `tracer serve --index` needs) and answers as before, escalating
    the same steps."""
    r = cascade_retriever(tiny_dir, tmp_path / "enc", minilm_small)
    assert r.res.embedder.name.startswith("m2v-trained-") and "finetuned-" in r.res.slow.embedder.name
    r.save(tmp_path / "index")
    again = Retriever.load(tmp_path / "index", device="cpu", cache_dir=None)
    assert ((again.res.embedder.name, again.res.slow.embedder.name)
            == (r.res.embedder.name, r.res.slow.embedder.name))
    assert again.scorer.threshold == r.scorer.threshold
    convs = [conversation(), conversation("search_flights"), conversation("list_files", request="files"),
             conversation(request="What's the weather in Oslo?"),
             conversation("get_weather", request="email it")]
    for msgs in convs:
        assert again.rank(msgs) == r.rank(msgs) and again.select_ids(msgs) == r.select_ids(msgs)
    steps = [step_from_messages(m) for m in convs]
    assert 0 < int(r.scorer.score(steps).diagnostics["escalated"].sum()) < len(steps)   # both stages answered


def test_a_saved_slow_embedder_config_may_only_name_a_tracer_encoder(retriever, tmp_path):
    from tracer.scorer_base.persist import read_meta

    retriever.save(tmp_path / "index")
    meta_path = next((tmp_path / "index").rglob("meta.json"))
    meta = json.loads(meta_path.read_text())
    meta["slow_embedder"] = {**meta["embedder"], "config": {"_target_": "os.system", "command": "echo pwned"}}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="slow_embedder.config"):
        read_meta(meta_path)
    meta["slow_embedder"] = {"name": "x"}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="malformed 'slow_embedder'"):
        read_meta(meta_path)
