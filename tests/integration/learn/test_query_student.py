"""A query encoder trained against its teacher's frozen tool vectors (``fixed_tools``) and served beside it
(:class:`tracer.encode.dual.DualEmbedder`), on the real MiniLM: training, the served resources, a saved index."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from builders import TINY_TOOLS, KeywordEmbedder, tiny_trajectories

from tracer.core.context import ContextRendering
from tracer.core.types import Registry
from tracer.encode.dual import DualEmbedder
from tracer.encode.embedders import CachedEmbedder, SentenceTransformerEmbedder, encode_tools
from tracer.eval.fold_encoders import FoldEncoders
from tracer.learn.encoder import TrainConfig, checkpoint_dir, finetuned, train, train_info
from tracer.learn.pairs import training_pairs

RENDERING = ContextRendering(join_users=True)
# a few dozen pairs, short texts: seconds on the CPU (as test_finetune.py), a 2-layer student
STUDENT = TrainConfig(batch_size=6, lr=1e-4, warmup=0.1, epochs=2, max_seq_length=48, seed=0, layers=(4, 5))
QUERY = dataclasses.replace(STUDENT, fixed_tools=True)
TOOLS = [t.search_text for t in TINY_TOOLS]


def _pairs():
    return training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), RENDERING)


def _gold_loss(query_model, tools_model: str) -> float:
    """Cross-entropy (scale 20) of each training anchor over every tool, the query side by one checkpoint (or
    model) and the tool side by another: the objective a query encoder is trained on, on the served embeddings."""
    pairs = _pairs()
    if isinstance(query_model, str):
        q = SentenceTransformerEmbedder(query_model, device="cpu", progress=0).encode(list(pairs.anchors))  # [N, d]
    else:
        q = query_model.encode(list(pairs.anchors), convert_to_tensor=True, normalize_embeddings=True)
    t = SentenceTransformerEmbedder(tools_model, device="cpu", progress=0).encode(TOOLS)                 # [R, d]
    gold = torch.tensor([TOOLS.index(p) for p in pairs.positives])
    return float(torch.nn.functional.cross_entropy(20 * q @ t.T, gold))


@pytest.fixture(scope="module")
def enc_dir(tmp_path_factory):
    """One encoder folder for the module: the teacher and the student are trained once, then found."""
    return tmp_path_factory.mktemp("encoders")


def test_a_query_student_learns_to_rank_its_teachers_tool_vectors(enc_dir):
    """The teacher is the symmetric full-depth recipe on the same pairs (trained first, recorded); the query
    student ranks the gold tool among the teacher's vectors better than the same student trained on both
    sides, and better than it did before training; the candidates enter its cache key."""
    from sentence_transformers import SentenceTransformer

    from tracer.encode.embedders import minilm_path
    from tracer.learn.student import keep_layers

    pairs = _pairs()
    path = finetuned(pairs, QUERY, encoder_dir=enc_dir, device="cpu", candidates=TOOLS)
    teacher = checkpoint_dir(pairs, QUERY.teacher(), None, enc_dir)
    assert QUERY.teacher() == dataclasses.replace(STUDENT, layers=())
    assert train_info(path)["teacher"] == str(teacher) and (teacher / "train_info.json").is_file()
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 2
    assert QUERY.key()["fixed_tools"] is True and "fixed_tools" not in STUDENT.key()
    both = finetuned(pairs, STUDENT, encoder_dir=enc_dir, device="cpu")
    untrained = SentenceTransformer(str(minilm_path()), device="cpu")
    keep_layers(untrained, STUDENT.layers)
    losses = {"query": _gold_loss(str(path), str(teacher)), "both sides": _gold_loss(str(both), str(teacher)),
              "untrained": _gold_loss(untrained, str(teacher))}
    # 0.62 against 0.78 and 0.82 (seeded, CPU-deterministic)
    assert losses["query"] < 0.85 * losses["both sides"] and losses["query"] < 0.8 * losses["untrained"], losses
    assert checkpoint_dir(pairs, QUERY, None, enc_dir, TOOLS) == path
    assert checkpoint_dir(pairs, QUERY, None, enc_dir, TOOLS + ["another tool"]) != path
    # distill: the contexts alone pulled towards the teacher's (the tool side is the teacher's already)
    distilled = dataclasses.replace(QUERY, distill=1.0)
    assert distilled.teacher() == QUERY.teacher()
    near = finetuned(pairs, distilled, encoder_dir=enc_dir, device="cpu", candidates=TOOLS)
    anchors = sorted(set(pairs.anchors))
    target = SentenceTransformerEmbedder(str(teacher), device="cpu", progress=0).encode(anchors)        # [A, d]
    gap = {name: float((SentenceTransformerEmbedder(str(p), device="cpu", progress=0).encode(anchors) - target)
                       .pow(2).sum(1).mean()) for name, p in (("query", path), ("distilled", near))}
    assert gap["distilled"] < 0.9 * gap["query"], gap  # 0.68 against 0.82 (seeded, CPU-deterministic)


def test_a_query_recipe_is_refused_without_what_it_needs(tmp_path):
    pairs = _pairs()
    with pytest.raises(ValueError, match="needs the candidate tool texts"):
        finetuned(pairs, QUERY, encoder_dir=tmp_path, device="cpu")
    with pytest.raises(ValueError, match="a teacher goes with distill > 0 or fixed_tools"):
        train(pairs, QUERY, device="cpu", candidates=TOOLS)
    assert len(set(pairs.positives) - set(TOOLS[:4])) == 2  # list_files and one more tool are left out
    with pytest.raises(ValueError, match=r"2 positives are not among the 4 candidates, e.g. 'list_files"):
        train(pairs, QUERY, device="cpu", teacher="unused", candidates=TOOLS[:4])
    with pytest.raises(ValueError, match="fixed_tools ranks each context against every registry tool"):
        FoldEncoders(Registry(TINY_TOOLS), {**dataclasses.asdict(QUERY), "layers": [], "negatives": "trie"},
                     embed_cache=None)
    with pytest.raises(ValueError, match="a static query encoder .* needs teacher"):  # test_static_query.py's
        FoldEncoders(Registry(TINY_TOOLS), {**dataclasses.asdict(QUERY), "layers": [], "kind": "static"},
                     embed_cache=None)


def test_fold_resources_embed_tools_by_the_teacher_and_a_saved_index_rebuilds_both(enc_dir, native_dir, tmp_path):
    """FoldEncoders serves the query student beside its teacher: the tool index holds the teacher's vectors,
    contexts are the student's; an index built by ``Retriever.from_dataset`` saves that nested config and
    ``Retriever.load`` rebuilds both encoders from it, ranking as before."""
    from tracer.retriever import Retriever

    recipe = {"context": {"join_users": True}, "device": "cpu", "encoder_dir": str(enc_dir),
              **dataclasses.asdict(QUERY)}
    encoders = FoldEncoders(Registry(TINY_TOOLS), recipe, embed_cache=None, device="cpu")
    res = encoders(tiny_trajectories())
    dual = res.embedder.inner
    assert isinstance(dual, DualEmbedder)
    path = checkpoint_dir(_pairs(), QUERY, None, enc_dir, TOOLS)
    teacher = checkpoint_dir(_pairs(), QUERY.teacher(), None, enc_dir)
    assert (dual.query.name, dual.tools.name) == (str(path), str(teacher))
    # the run's record of the student names its teacher and the teacher's own training time
    (record,) = encoders.history
    assert (record["checkpoint"], record["teacher"]) == (str(path), str(teacher))
    assert record["teacher_train_seconds"] == train_info(teacher)["train_seconds"] > 0
    assert record["train_seconds"] == train_info(path)["train_seconds"]
    torch.testing.assert_close(torch.from_numpy(res.tool_index.vectors),
                               SentenceTransformerEmbedder(str(teacher), device="cpu", progress=0).encode(TOOLS))
    anchors = list(_pairs().anchors[:5])
    torch.testing.assert_close(res.embedder.encode(anchors),
                               SentenceTransformerEmbedder(str(path), device="cpu", progress=0).encode(anchors))
    r = Retriever.from_dataset(native_dir, "tracer_fixed", device="cpu", cache_dir=None, encoder_training=recipe)
    assert r.res.embedder.name == dual.name  # the same checkpoints: nothing trained again
    r.save(tmp_path / "index")
    again = Retriever.load(tmp_path / "index", device="cpu", cache_dir=None)
    assert isinstance(again.res.embedder.inner, DualEmbedder) and again.res.embedder.name == dual.name
    for msgs in ([{"role": "user", "content": "Find a flight from SFO to JFK and book it"}],
                 [{"role": "user", "content": "list my files"}]):
        assert again.rank(msgs) == r.rank(msgs)


class Negated:
    """The keyword embedder's rows negated: another encoder in the same space, told apart by sign."""

    def __init__(self):
        self.keywords = KeywordEmbedder()
        self.name, self.dim = "negated", self.keywords.dim

    def encode(self, texts):
        return -self.keywords.encode(texts)


def test_every_tool_text_is_embedded_by_the_tool_side(keyword_embedder):
    """The tool index, a grown or renamed registry (the online updater's) and the gateway's vectors of tools
    the index does not know all take ``encode_tools``; contexts take ``encode``."""
    from types import SimpleNamespace

    from tracer.core.types import Tool
    from tracer.online.updates import grow_resources, rename_resources
    from tracer.scoring.resources import Resources
    from tracer.serve.selection import UnknownToolVectors

    res = Resources.build(Registry(TINY_TOOLS), CachedEmbedder(DualEmbedder(keyword_embedder, Negated())), device="cpu")
    assert torch.equal(torch.from_numpy(res.tool_index.vectors), -keyword_embedder.encode(TOOLS))
    new = Tool("book_hotel", "Book a hotel room")
    grown = grow_resources(res, [new])
    assert torch.equal(torch.from_numpy(grown.tool_index.vectors[-1]), -keyword_embedder.encode([new.search_text])[0])
    renamed = rename_resources(res, TINY_TOOLS[0].name, "find_flights")
    text = renamed.registry[0].search_text
    assert torch.equal(torch.from_numpy(renamed.tool_index.vectors[0]), -keyword_embedder.encode([text])[0])
    unknown = UnknownToolVectors().get(SimpleNamespace(res=res), [new.to_openai()])
    assert torch.equal(torch.from_numpy(unknown), -keyword_embedder.encode([new.search_text]))
    context = "find a flight and book it"
    assert torch.equal(res.embedder.encode([context]), keyword_embedder.encode([context]))


def test_the_dual_embedder_caches_each_side_apart(tmp_path, keyword_embedder):
    dual = CachedEmbedder(DualEmbedder(keyword_embedder, Negated()), tmp_path)
    text = TOOLS[0]
    torch.testing.assert_close(dual.encode([text]), keyword_embedder.encode([text]))
    torch.testing.assert_close(encode_tools(dual, [text]), -keyword_embedder.encode([text]))
    again = CachedEmbedder(DualEmbedder(keyword_embedder, Negated()), tmp_path)  # from the disk shards
    torch.testing.assert_close(encode_tools(again, [text]), -keyword_embedder.encode([text]))
    torch.testing.assert_close(again.encode([text]), keyword_embedder.encode([text]))
    assert again.n_encoded == 0 and dual.n_encoded == 2
    # one encoder for both: encode_tools is encode, one cache entry per text
    single = CachedEmbedder(keyword_embedder)
    torch.testing.assert_close(encode_tools(single, [text]), single.encode([text]))
    assert single.n_encoded == 1
    with pytest.raises(ValueError, match="must share one space"):
        DualEmbedder(keyword_embedder, KeywordEmbedder(("flight",)))
