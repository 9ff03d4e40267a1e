"""Two encoders in one space: a light one for the live query, a heavy one for tool texts.

A live step encodes one context; the tools are encoded once, when an index is built or a tool is added.
So the tool side can afford the full fine-tuned encoder while the query side is a shallow student trained
to land its contexts next to that encoder's tool vectors (``encoder_training.fixed_tools``,
:mod:`tracer.learn.encoder`). Everything that embeds a *tool text* calls
:func:`tracer.encode.embedders.encode_tools`; contexts
(live queries, memories, past steps) go through ``encode``, so context-to-context similarities stay
within the query encoder.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tracer.encode.embedders import Embedder, encode_tools


class DualEmbedder:
    """``encode`` by ``query``, ``encode_tools`` by ``tools``; both must give rows of one dimension.

    Args:
        query: the embedder of contexts (the one a live step pays for).
        tools: the embedder of tool texts, in whose space ``query`` was trained.
    """

    def __init__(self, query: Embedder, tools: Embedder):
        if query.dim != tools.dim:
            raise ValueError(f"DualEmbedder: the query encoder {query.name!r} gives dim {query.dim} and the tool "
                             f"encoder {tools.name!r} dim {tools.dim}; they must share one space")
        self.query, self.tools = query, tools
        self.name = f"{query.name}+tools:{tools.name}"
        self.dim = query.dim
        # both encoders' content, for the embedding cache's keys (empty when neither has one)
        sides = [str(getattr(e, "fingerprint", "") or "") for e in (query, tools)]
        self.fingerprint = "+tools:".join(sides) if any(sides) else ""

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        return self.query.encode(texts)                 # [N, d]

    def encode_tools(self, texts: Sequence[str]) -> torch.Tensor:
        return encode_tools(self.tools, texts)          # [N, d]
