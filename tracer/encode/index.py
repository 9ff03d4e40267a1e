"""The vector fallback: a FAISS inner-product index over embedded tool names and descriptions.

Vectors are L2-normalised, so inner product is cosine. ``IndexFlatIP`` (exact) is the default; an
index factory string (e.g. ``"HNSW32,Flat"``) can be configured for large registries. With
faiss-gpu and CUDA present the index is moved to the GPU. As in DPR's ``faiss_indexers.py`` the
FAISS ids map to tool names and the map is checked on load.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
import torch

from tracer.core.store import CorruptIndex, read_json
from tracer.core.types import Registry
from tracer.encode.embedders import Embedder, encode_tools


def _maybe_gpu(index: faiss.Index, use_gpu: bool | None) -> faiss.Index:
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
        vecs = encode_tools(embedder, [t.search_text for t in registry])  # [N, d]
        return cls(registry.names, vecs, factory, use_gpu)

    def __len__(self) -> int:
        return len(self.names)

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k tools per query: (scores ``[B, k]``, ids ``[B, k]``), ids into ``names``."""
        q = np.ascontiguousarray(queries.detach().cpu().numpy(), dtype=np.float32)  # [B, d]
        scores, ids = self.index.search(q, min(k, len(self)))
        return torch.from_numpy(scores), torch.from_numpy(ids)

    @property
    def exact(self) -> bool:
        """Whether the index is exact (``Flat``): then dense scores are one matmul, not a FAISS search."""
        return self.factory == "Flat"

    def _matrix64(self, device: torch.device) -> torch.Tensor:
        """The tool matrix in float64 on ``device``, ``[N, d]`` (cached per device)."""
        cache = self.__dict__.setdefault("_m64", {})
        if device not in cache:
            cache[device] = torch.from_numpy(self.vectors).to(device, torch.float64)
        return cache[device]

    def dense_scores(self, queries: torch.Tensor) -> torch.Tensor:
        """Cosine of every query with every tool, ``[B, N]`` float32 in registry order (on the CPU).

        For the exact (``Flat``) index this is one matmul accumulated in float64 and rounded to
        float32: the same numbers FAISS computes (to float32 rounding; tested), but independent of
        the batch size, so that :meth:`dense_scores_one` agrees with it bit for bit. Other indexes
        go through a FAISS search over all N (tools it does not return score ``-inf``). Ties at equal
        cosine are broken by registry order downstream (stable sorts).
        """
        if self.exact:
            q = queries.detach()
            return (q.to(torch.float64) @ self._matrix64(q.device).T).float().cpu()  # [B, N]
        scores, ids = self.search(queries, len(self))  # [B, N], [B, N]; id -1 = not returned
        n = len(self)
        out = torch.full((queries.shape[0], n + 1), float("-inf"))
        out.scatter_(1, torch.where(ids >= 0, ids.long(), n), scores)  # misses land in a dump column
        return out[:, :n]

    # ---- drift: a new index over changed rows (the old one keeps serving until it is swapped) ---------
    def with_rows(self, names: Sequence[str] = (), vectors: np.ndarray | torch.Tensor | None = None,
                  replace: dict[int, tuple[str, np.ndarray]] | None = None) -> ToolIndex:
        """A new index: these tools appended (``vectors [M, d]``, normalised) and rows of ``replace``
        (id -> (name, vector ``[d]``)) overwritten. Equal to building the index on the union."""
        vecs = self.vectors.copy()
        out_names = list(self.names)
        for i, (name, vec) in (replace or {}).items():
            out_names[i], vecs[i] = name, np.asarray(vec, dtype=np.float32)
        if vectors is None:
            vectors = np.zeros((0, self.dim), np.float32)
        add = np.asarray(vectors.detach().cpu().numpy() if isinstance(vectors, torch.Tensor) else vectors,
                         dtype=np.float32).reshape(-1, self.dim)                             # [M, d]
        if len(add) != len(names):
            raise ValueError(f"{len(names)} new names but {len(add)} vectors")
        return ToolIndex(out_names + list(names), torch.from_numpy(np.concatenate([vecs, add])), self.factory,
                         use_gpu=self.index is not self._cpu)

    # ---- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        faiss.write_index(self._cpu, str(d / "tools.faiss"))
        (d / "tools_idmap.json").write_text(json.dumps({"factory": self.factory, "names": list(self.names)}))
        np.save(d / "tool_vectors.npy", self.vectors)

    @classmethod
    def load(cls, directory: str | Path, registry: Registry, use_gpu: bool | None = None) -> ToolIndex:
        d = Path(directory)
        meta = read_json(d / "tools_idmap.json")
        if not isinstance(meta, dict) or not isinstance(meta.get("names"), list) or "factory" not in meta:
            raise CorruptIndex(d / "tools_idmap.json", "expected {'factory': ..., 'names': [...]}")
        if tuple(meta["names"]) != registry.names:
            raise ValueError(f"{d / 'tools_idmap.json'}: FAISS id map does not match the registry "
                             f"({len(meta['names'])} ids vs {len(registry)} tools)")
        try:
            index = faiss.read_index(str(d / "tools.faiss"))
        except RuntimeError as e:
            raise CorruptIndex(d / "tools.faiss", f"FAISS cannot read it ({str(e).splitlines()[0]})") from None
        if index.ntotal != len(registry):
            raise ValueError(f"{d / 'tools.faiss'}: index holds {index.ntotal} vectors, registry {len(registry)}")
        obj = cls.__new__(cls)
        obj.names, obj.factory = tuple(meta["names"]), meta["factory"]
        try:
            obj.vectors = np.load(d / "tool_vectors.npy")
        except (OSError, ValueError) as e:
            raise CorruptIndex(d / "tool_vectors.npy", f"numpy cannot read it ({e})") from None
        if obj.vectors.ndim != 2 or len(obj.vectors) != len(registry):
            raise CorruptIndex(d / "tool_vectors.npy", f"shape {obj.vectors.shape}, expected [{len(registry)}, d]")
        obj.dim = obj.vectors.shape[1]
        obj._cpu = index
        obj.index = _maybe_gpu(index, use_gpu)
        return obj
