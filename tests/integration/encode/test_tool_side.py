"""An embedder with a tool side (``encode_tools`` beside ``encode``): every tool text is embedded by that
side, contexts by the other, and the embedding cache keeps the two apart. Checked with a keyword embedder and
its negation, so which side embedded a row is told by its sign."""

from __future__ import annotations

import torch
from builders import TINY_TOOLS, KeywordEmbedder

from tracer.core.types import Registry
from tracer.encode.embedders import CachedEmbedder, encode_tools

TOOLS = [t.search_text for t in TINY_TOOLS]


class ToolSide:
    """Contexts by the keyword embedder, tool texts by its negation: two encoders in one space."""

    def __init__(self):
        self.keywords = KeywordEmbedder()
        self.name, self.dim = "keyword+tools:negated", self.keywords.dim

    def encode(self, texts):
        return self.keywords.encode(texts)

    def encode_tools(self, texts):
        return -self.keywords.encode(texts)


def test_every_tool_text_is_embedded_by_the_tool_side(keyword_embedder):
    """The tool index, a grown or renamed registry (the online updater's) and the gateway's vectors of tools
    the index does not know all take ``encode_tools``; contexts take ``encode``."""
    from types import SimpleNamespace

    from tracer.core.types import Tool
    from tracer.online.incremental import grow_resources, rename_resources
    from tracer.scorer_base.resources import Resources
    from tracer.serve.selection import UnknownToolVectors

    res = Resources.build(Registry(TINY_TOOLS), CachedEmbedder(ToolSide()), device="cpu")
    assert torch.equal(torch.from_numpy(res.tool_index.vectors), -keyword_embedder.encode(TOOLS))
    new = Tool("book_hotel", "Book a hotel room")
    grown = grow_resources(res, [new])
    want = -keyword_embedder.encode([new.search_text])[0]
    assert torch.equal(torch.from_numpy(grown.tool_index.vectors[-1]), want)
    renamed = rename_resources(res, TINY_TOOLS[0].name, "find_flights")
    text = renamed.registry[0].search_text
    assert torch.equal(torch.from_numpy(renamed.tool_index.vectors[0]), -keyword_embedder.encode([text])[0])
    unknown = UnknownToolVectors().get(SimpleNamespace(res=res), [new.to_openai()])
    assert torch.equal(torch.from_numpy(unknown), -keyword_embedder.encode([new.search_text]))
    context = "find a flight and book it"
    assert torch.equal(res.embedder.encode([context]), keyword_embedder.encode([context]))


def test_the_embedding_cache_keeps_each_side_apart(tmp_path, keyword_embedder):
    two = CachedEmbedder(ToolSide(), tmp_path)
    text = TOOLS[0]
    torch.testing.assert_close(two.encode([text]), keyword_embedder.encode([text]))
    torch.testing.assert_close(encode_tools(two, [text]), -keyword_embedder.encode([text]))
    again = CachedEmbedder(ToolSide(), tmp_path)  # from the disk shards
    torch.testing.assert_close(encode_tools(again, [text]), -keyword_embedder.encode([text]))
    torch.testing.assert_close(again.encode([text]), keyword_embedder.encode([text]))
    assert again.n_encoded == 0 and two.n_encoded == 2
    # one encoder for both: encode_tools is encode, one cache entry per text
    single = CachedEmbedder(keyword_embedder)
    torch.testing.assert_close(encode_tools(single, [text]), single.encode([text]))
    assert single.n_encoded == 1
