"""An embedder's optional capabilities (tracer/encode/embedders.py, tracer/encode/bundle.py) are declared
protocols, checked with isinstance: an embedder with only ``name``, ``dim`` and ``encode`` gets each default,
and one that declares a capability is read through it."""

from __future__ import annotations

import torch
from builders import KeywordEmbedder

from tracer.core.tool_text import tool_text
from tracer.core.types import Tool
from tracer.encode.bundle import ENCODERS, Carried, Fingerprinted, Served, carry
from tracer.encode.embedders import (
    BuiltEmbedder,
    CachedEmbedder,
    Embedder,
    ReadsTools,
    ToolSide,
    encode_tools,
    tool_rows,
    tool_style,
)

WEATHER = Tool(name="get_weather", description="Weather for a city",
               parameters={"type": "object", "properties": {"city": {"type": "string",
                                                                      "description": "the email address"}}})


class Declaring(KeywordEmbedder):
    """The keyword embedder declaring every capability: tools read with their parameters and embedded negated
    (so a row's sign tells which side made it), files it runs on in ``folder``."""

    tool_text = "parameters"

    def __init__(self, folder):
        super().__init__()
        self.folder = folder
        self.fingerprint = "f" * 64
        self.loads_as = {"_target_": "somewhere.Else"}

    def encode_tools(self, texts):
        return -self.encode(texts)

    def served(self):
        return Served(self.folder, ("weights.bin",), {"name": "declared"})


def test_an_embedder_with_only_the_core_gets_every_default(tmp_path):
    plain = KeywordEmbedder()
    assert isinstance(plain, Embedder)
    assert not isinstance(plain, (ToolSide, ReadsTools, Fingerprinted, Carried, BuiltEmbedder))
    assert tool_style(plain) == "name_description"
    texts = ["book a flight", "email Bob"]
    assert torch.equal(encode_tools(plain, texts), plain.encode(texts))
    # name and description only: the parameter's "email" keyword is not read
    assert torch.equal(tool_rows(plain, [WEATHER]), plain.encode(["get_weather: Weather for a city"]))
    assert carry(plain, tmp_path / "snap") is None and not (tmp_path / "snap").exists()
    cached = CachedEmbedder(plain)
    assert cached.fingerprint == "" and cached.tool_text == "name_description"


def test_declared_capabilities_are_read_through_their_protocols(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"\x00\x01weights")
    (tmp_path / "model" / "unused.txt").write_text("not served")
    emb = Declaring(tmp_path / "model")
    assert isinstance(emb, ToolSide) and isinstance(emb, ReadsTools)
    assert isinstance(emb, Fingerprinted) and isinstance(emb, Carried) and isinstance(emb, BuiltEmbedder)
    assert tool_style(emb) == "parameters"
    # read with its parameter ("email" keyword), embedded by the tool side (negated)
    want = -KeywordEmbedder().encode([tool_text(WEATHER, "parameters")])
    assert torch.equal(tool_rows(emb, [WEATHER]), want)
    assert want[0, KeywordEmbedder().keywords.index("email")] < 0
    cached = CachedEmbedder(emb)
    assert cached.fingerprint == "f" * 64 and cached.tool_text == "parameters"
    assert torch.equal(encode_tools(cached, ["email Bob"]), -emb.encode(["email Bob"]))

    rel, config = carry(emb, tmp_path / "snap")
    assert config == {"name": "declared"} and rel.startswith(f"{ENCODERS}/")
    copied = tmp_path / "snap" / rel
    assert (copied / "weights.bin").read_bytes() == b"\x00\x01weights"
    assert not (copied / "unused.txt").exists()  # only what served() names


def test_a_fingerprint_keys_the_cache_whether_or_not_files_are_carried(tmp_path):
    """A fingerprint alone (a user's embedder over its own weights) keys the cache and carries nothing; so
    does a ``served()`` of None (the MiniLM packaged with tracer)."""

    class Weighted(KeywordEmbedder):
        fingerprint = "weights-digest"

    class Packaged(Weighted):
        def served(self):
            return None

    for emb in (Weighted(), Packaged()):
        assert isinstance(emb, Fingerprinted) and isinstance(emb, Carried) == (type(emb) is Packaged)
        assert carry(emb, tmp_path / "snap") is None and not (tmp_path / "snap").exists()
        assert CachedEmbedder(emb).fingerprint == "weights-digest"
    # the fingerprint is in the key: same name, same text, another fingerprint, another cache folder
    texts = ["book a flight"]
    one = CachedEmbedder(Weighted(), tmp_path / "cache")
    other = CachedEmbedder(KeywordEmbedder(), tmp_path / "cache")
    one.encode(texts)
    other.encode(texts)
    assert one.cache_dir != other.cache_dir and one.n_encoded == other.n_encoded == 1


class Built(KeywordEmbedder):
    """A keyword embedder as a builder makes one: its ``loads_as`` names the config that loads the result."""

    def __init__(self, keywords=("flight",)):
        super().__init__(keywords)
        self.loads_as = {"_target_": f"{__name__}.KeywordEmbedder", "keywords": ["flight"]}


def test_build_embedder_keeps_the_config_a_builder_names():
    """A saved index rebuilds what a builder made from its ``loads_as``, and any other embedder from the
    config that built it."""
    from tracer.build import build_embedder

    built = build_embedder({"_target_": f"{__name__}.Built", "cache_dir": None})
    assert isinstance(built.inner, BuiltEmbedder)
    assert built.config == {"_target_": f"{__name__}.KeywordEmbedder", "keywords": ["flight"]}
    keywords = {"_target_": f"{__name__}.KeywordEmbedder", "keywords": ["book"]}
    plain = build_embedder({**keywords, "cache_dir": None})
    assert not isinstance(plain.inner, BuiltEmbedder)
    assert plain.config == keywords
