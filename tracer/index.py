"""The vector fallback: a FAISS inner-product index over embedded tool names and descriptions.

Vectors are L2-normalised, so inner product is cosine. ``IndexFlatIP`` (exact) is the default; an
index factory string (e.g. ``"HNSW32,Flat"``) can be configured for large registries. With
faiss-gpu and CUDA present the index is moved to the GPU. As in DPR's ``faiss_indexers.py`` the
FAISS ids map to tool names and the map is checked on load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import faiss
import numpy as np
import torch

from .embed import Embedder
from .types import Registry


def _maybe_gpu(index: "faiss.Index", use_gpu: bool | None) -> "faiss.Index":
    want = torch.cuda.is_available() if use_gpu is None else use_gpu
    if want and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    return index


class ToolIndex:
    """FAISS index of a registry's tools.

    Args:
        names: tool names, in FAISS id order (the registry order).
        vectors: ``[N, d]`` normalised tool embeddings.
        factory: FAISS index factory string; ``"Flat"`` means exact inner product.
    """

    def __init__(self, names: Sequence[str], vectors: torch.Tensor, factory: str = "Flat",
                 use_gpu: bool | None = None):
        vecs = np.ascontiguousarray(vectors.detach().cpu().numpy(), dtype=np.float32)  # [N, d]
        if vecs.shape[0] != len(names):
            raise ValueError(f"{len(names)} names but {vecs.shape[0]} vectors")
        self.names = tuple(names)
        self.dim = vecs.shape[1]
        self.factory = factory
        self.vectors = vecs
        cpu = faiss.IndexFlatIP(self.dim) if factory == "Flat" else faiss.index_factory(
            self.dim, factory, faiss.METRIC_INNER_PRODUCT)
        if not cpu.is_trained:
            cpu.train(vecs)
        cpu.add(vecs)
        self._cpu = cpu
        self.index = _maybe_gpu(cpu, use_gpu)

    @classmethod
    def build(cls, registry: Registry, embedder: Embedder, factory: str = "Flat",
              use_gpu: bool | None = None) -> ToolIndex:
        vecs = embedder.encode([t.search_text for t in registry])  # [N, d]
        return cls(registry.names, vecs, factory, use_gpu)

    def __len__(self) -> int:
        return len(self.names)

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k tools per query: (scores ``[B, k]``, ids ``[B, k]``), ids into ``names``."""
        q = np.ascontiguousarray(queries.detach().cpu().numpy(), dtype=np.float32)  # [B, d]
        scores, ids = self.index.search(q, min(k, len(self)))
        return torch.from_numpy(scores), torch.from_numpy(ids)

    def dense_scores(self, queries: torch.Tensor) -> torch.Tensor:
        """Cosine of every query with every tool, ``[B, N]`` in registry order (FAISS search over all N).

        Ties at equal cosine are broken by registry order downstream (stable sorts), so the
        result does not depend on the order FAISS returns equal scores in.
        """
        scores, ids = self.search(queries, len(self))  # [B, N], [B, N]
        out = torch.full((queries.shape[0], len(self)), float("-inf"))
        out.scatter_(1, ids.clamp_min(0).long(), scores)
        return out

    # ---- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        faiss.write_index(self._cpu, str(d / "tools.faiss"))
        (d / "tools_idmap.json").write_text(json.dumps({"factory": self.factory, "names": list(self.names)}))
        np.save(d / "tool_vectors.npy", self.vectors)

    @classmethod
    def load(cls, directory: str | Path, registry: Registry, use_gpu: bool | None = None) -> ToolIndex:
        d = Path(directory)
        meta = json.loads((d / "tools_idmap.json").read_text())
        if tuple(meta["names"]) != registry.names:
            raise ValueError(f"{d / 'tools_idmap.json'}: FAISS id map does not match the registry "
                             f"({len(meta['names'])} ids vs {len(registry)} tools)")
        index = faiss.read_index(str(d / "tools.faiss"))
        if index.ntotal != len(registry):
            raise ValueError(f"{d / 'tools.faiss'}: index holds {index.ntotal} vectors, registry {len(registry)}")
        obj = cls.__new__(cls)
        obj.names, obj.factory = tuple(meta["names"]), meta["factory"]
        obj.vectors = np.load(d / "tool_vectors.npy")
        obj.dim = obj.vectors.shape[1]
        obj._cpu = index
        obj.index = _maybe_gpu(index, use_gpu)
        return obj
