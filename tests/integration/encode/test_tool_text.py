"""How a tool reads to an encoder (tracer/core/tool_text.py): the renderings, and that every place which
embeds tools (the tool index, the online updater's grown and renamed registries, the gateway's vectors of
tools the index does not know) reads them as the embedder was trained to, which a saved index keeps. A
keyword embedder tells which text was embedded (a keyword only a parameter's description holds); the
saved index is checked with the real MiniLM."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from builders import ROOT, KeywordEmbedder

from tracer.build import build_embedder
from tracer.core.tool_text import tool_text
from tracer.core.types import Registry, Tool
from tracer.encode.embedders import CachedEmbedder, recorded_tool_text, tool_rows
from tracer.online.incremental import grow_resources, rename_resources
from tracer.retriever import Retriever
from tracer.scorer_base.resources import Resources
from tracer.serve.selection import Keyed, UnknownToolVectors

WEATHER = Tool("get_weather", "Forecast for a place",
               {"type": "object", "properties": {"city": {"description": "the city"},
                                                 "days": {"type": "integer"}}, "required": ["city"]})
MAIL = Tool("send_email", "Send an email message", {"type": "object", "properties": {}})


def test_the_renderings():
    assert tool_text(WEATHER) == "get_weather: Forecast for a place"
    assert tool_text(WEATHER, "parameters") == "get_weather: Forecast for a place | city: the city | days: "
    assert tool_text(MAIL, "parameters") == tool_text(MAIL) == "send_email: Send an email message"
    odd = Tool("odd", "x", {"properties": {"a": "not a schema"}})  # a malformed property reads as no text
    assert tool_text(odd, "parameters") == "odd: x | a: "
    with pytest.raises(ValueError, match="tool_text must be one of name_description, parameters, got 'p'"):
        tool_text(WEATHER, "p")


class ReadsParameters(KeywordEmbedder):
    """The keyword embedder, said to be trained on tools read with their parameters."""

    tool_text = "parameters"


def test_every_tool_vector_reads_the_tool_as_the_embedder_does():
    emb = CachedEmbedder(ReadsParameters(("weather", "email", "city", "flight")))
    assert emb.tool_text == "parameters"
    want = emb.inner.encode([tool_text(WEATHER, "parameters")])[0]                    # weather + city
    assert want[2] > 0  # the parameter's description was read
    res = Resources.build(Registry([MAIL, WEATHER]), emb, device="cpu")
    assert torch.equal(torch.from_numpy(res.tool_index.vectors[1]), want)
    flight = Tool("book_flight", "Book it", {"properties": {"to": {"description": "destination city"}}})
    grown = grow_resources(res, [flight])
    assert torch.equal(torch.from_numpy(grown.tool_index.vectors[-1]),
                       emb.inner.encode(["book_flight: Book it | to: destination city"])[0])
    renamed = rename_resources(res, "get_weather", "forecast")
    assert torch.equal(torch.from_numpy(renamed.tool_index.vectors[1]),
                       emb.inner.encode(["forecast: Forecast for a place | city: the city | days: "])[0])
    unknown = UnknownToolVectors()
    assert unknown.missing(Keyed.of([flight.to_openai()], "parameters"))
    got = unknown.get(SimpleNamespace(res=res), [flight.to_openai()])
    assert (got[0] == grown.tool_index.vectors[-1]).all()
    assert not unknown.missing(Keyed.of([flight.to_openai()], "parameters"))
    assert unknown.missing(Keyed.of([flight.to_openai()]))  # another reading of the tool is another text
    # an embedder that says nothing reads name and description
    plain = CachedEmbedder(KeywordEmbedder(("weather", "city")))
    assert torch.equal(tool_rows(plain, [WEATHER]), plain.inner.encode(["get_weather: Forecast for a place"]))


def test_a_saved_index_keeps_how_its_encoder_reads_tools(minilm, tmp_path):
    data = shutil.copytree(ROOT / "data" / "example", tmp_path / "data")
    tools = json.loads((data / "tools.json").read_text())
    for t in tools:  # each tool gains a parameter its description does not name
        t["function"]["parameters"]["properties"] = {"ref": {"type": "string", "description": "booking code"}}
    (data / "tools.json").write_text(json.dumps(tools))
    emb = build_embedder("minilm", tool_text="parameters", cache_dir=None, device="cpu")
    assert emb.config["tool_text"] == "parameters"
    r = Retriever.from_dataset(data, scorer="tracer_fixed", embedder=emb, device="cpu")
    tools = list(r.registry)
    texts = [tool_text(t, "parameters") for t in tools]
    assert texts != [t.search_text for t in tools]
    torch.testing.assert_close(torch.from_numpy(r.res.tool_index.vectors), minilm.encode(texts), rtol=0,
                               atol=1e-6)
    r.save(tmp_path / "index")
    loaded = Retriever.load(tmp_path / "index", device="cpu")
    assert loaded.res.embedder.tool_text == "parameters"
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
    assert loaded.rank(msgs) == r.rank(msgs)
    with pytest.raises(ValueError, match="SentenceTransformerEmbedder tool_text must be one of"):
        build_embedder("minilm", tool_text="params", cache_dir=None)


def test_a_checkpoints_recorded_tool_text_is_read_and_checked(tmp_path):
    assert recorded_tool_text(tmp_path) == "name_description"          # a model tracer did not train
    (tmp_path / "train_info.json").write_text(json.dumps({"pairs": 3}))
    assert recorded_tool_text(tmp_path) == "name_description"          # trained before it was recorded
    (tmp_path / "train_info.json").write_text(json.dumps({"tool_text": "parameters"}))
    assert recorded_tool_text(tmp_path) == "parameters"
    (tmp_path / "train_info.json").write_text(json.dumps({"tool_text": "schema"}))
    with pytest.raises(ValueError, match=r"train_info.json: tool_text must be one of .*'schema'"):
        recorded_tool_text(tmp_path)
