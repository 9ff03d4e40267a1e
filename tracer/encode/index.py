"""The vector fallback: a FAISS inner-product index over embedded tool names and descriptions.

Vectors are L2-normalised, so inner product is cosine. ``IndexFlatIP`` (exact) is the default; an
index factory string (e.g. ``"HNSW32,SQfp16"``) builds an approximate index for large registries, and
``"auto"`` picks exact up to :data:`EXACT_UP_TO` tools and :data:`ANN_FACTORY` above (the threshold is
measured: docs/performance.md). An approximate index answers a query with its ``ann_k`` best tools,
rescored exactly (float64, as the exact path), every other tool scoring ``-inf``: what the scorers rank is
then the retrieved tools, and a step's cost no longer grows with the registry. With faiss-gpu and CUDA
present an exact index is moved to the GPU (FAISS has no GPU HNSW). As in DPR's ``faiss_indexers.py``
the FAISS ids map to tool names and the map is checked on load.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
import torch

from tracer.core.store import CorruptIndex, read_json
from tracer.core.types import Registry
from tracer.encode.embedders import Embedder, tool_rows

EXACT_UP_TO = 2048          # "auto": an exact index up to this many tools
ANN_FACTORY = "HNSW32,SQfp16"  # "auto" above it: HNSW over float16 codes (half the bytes a hop reads)
ANN_K = 32                   # tools an approximate index retrieves per query


def ef_search_for(n: int, ann_k: int = ANN_K) -> int:
    """HNSW's search breadth over ``n`` tools when none is given: 32 up to 10,000 tools, then growing as
    sqrt(n) (102 at 100,000), never below ``ann_k``. A fixed breadth finds less of the exact top 10 as the
    registry grows: on BFCL (``benchmarks/bench_registry.py``, docs/performance.md) 32 loses no recall@5 step
    against exact search at 10,000 tools, while at 100,000 64 loses 4 and 96 none."""
    return max(ann_k, math.ceil(32 * math.sqrt(max(n, 10_000) / 10_000)))


def resolve_factory(factory: str, n: int) -> str:
    """The FAISS factory string ``factory`` stands for over ``n`` tools (``"auto"`` picks by size)."""
    if factory == "auto":
        return "Flat" if n <= EXACT_UP_TO else ANN_FACTORY
    return factory


def _maybe_gpu(index: faiss.Index, use_gpu: bool | None) -> faiss.Index:
    if not isinstance(index, faiss.IndexFlat):
        return index  # only an exact index moves (FAISS has no GPU HNSW)
    want = torch.cuda.is_available() if use_gpu is None else use_gpu
    # the installed FAISS build is asked, not an index: faiss-cpu has no StandardGpuResources
    if want and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    return index


class ToolIndex:
    """FAISS index of a registry's tools.

    Args:
        names: tool names, in FAISS id order (the registry order).
        vectors: ``[N, d]`` normalised tool embeddings.
        factory: FAISS index factory string; ``"Flat"`` means exact inner product, ``"auto"`` picks by
            registry size (:func:`resolve_factory`).
        ann_k: tools an approximate index retrieves per query (the rest score ``-inf``).
        ef_search: HNSW's search breadth (at least ``ann_k``; ``None``: :func:`ef_search_for` the registry's
            size, derived again when :meth:`with_rows` changes it).
    """

    def __init__(self, names: Sequence[str], vectors: torch.Tensor, factory: str = "Flat",
                 use_gpu: bool | None = None, ann_k: int = ANN_K, ef_search: int | None = None):
        vecs = np.ascontiguousarray(vectors.detach().cpu().numpy(), dtype=np.float32)  # [N, d]
        if vecs.shape[0] != len(names):
            raise ValueError(f"{len(names)} names but {vecs.shape[0]} vectors")
        if ann_k < 1 or (ef_search is not None and ef_search < ann_k):
            raise ValueError(f"ann_k={ann_k}, ef_search={ef_search}: need 1 <= ann_k <= ef_search")
        self.names = tuple(names)
        self.dim = vecs.shape[1]
        self.factory = resolve_factory(factory, len(self.names))
        self.vectors = vecs
        self.ann_k, self.ef_given = ann_k, ef_search
        self.ef_search = ef_search_for(len(self.names), ann_k) if ef_search is None else ef_search
        cpu = faiss.IndexFlatIP(self.dim) if self.factory == "Flat" else faiss.index_factory(
            self.dim, self.factory, faiss.METRIC_INNER_PRODUCT)
        if not cpu.is_trained:
            cpu.train(vecs)
        cpu.add(vecs)
        self._cpu = cpu
        self._tune()
        self.index = _maybe_gpu(cpu, use_gpu)

    def _tune(self) -> None:
        if isinstance(self._cpu, faiss.IndexHNSW):  # every "HNSW..." factory string's index
            self._cpu.hnsw.efSearch = self.ef_search

    @classmethod
    def build(cls, registry: Registry, embedder: Embedder, factory: str = "Flat",
              use_gpu: bool | None = None, **ann) -> ToolIndex:
        vecs = tool_rows(embedder, registry)  # [N, d]
        return cls(registry.names, vecs, factory, use_gpu, **ann)

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
        q = np.ascontiguousarray(queries.detach().cpu().numpy(), dtype=np.float32)     # [B, d]
        out = np.full((len(q), len(self)), -np.inf, dtype=np.float32)                    # [B, N]
        # query by query: the live path's own call, so the two agree bit for bit
        for row, query in zip(out, q):
            ids, scores = self.top_one(query)
            row[ids] = scores
        return torch.from_numpy(out)

    def top_one(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """An approximate index's answer to one query ``[d]``: (registry ids ``[T]``, cosines ``[T]``
        float32), best first, ties by registry position; T = ``ann_k`` (fewer when the index returns fewer).
        The cosines are exact (float64 dot products rounded to float32, the exact path's numbers)."""
        q32 = np.ascontiguousarray(np.asarray(query, dtype=np.float32).reshape(1, -1))
        _, ids = self._cpu.search(q32, min(self.ann_k, len(self)))
        ids = ids[0][ids[0] >= 0].astype(np.int64)                                        # [T]
        scores = (self.vectors[ids].astype(np.float64) @ q32[0].astype(np.float64)).astype(np.float32)
        order = np.lexsort((ids, -scores))
        return ids[order], scores[order]

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
                         use_gpu=self.index is not self._cpu, ann_k=self.ann_k, ef_search=self.ef_given)

    # ---- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        faiss.write_index(self._cpu, str(d / "tools.faiss"))
        meta = {"factory": self.factory, "names": list(self.names)}
        if not self.exact:
            meta.update(ann_k=self.ann_k, ef_search=self.ef_given)  # null: derived from the size on load
        (d / "tools_idmap.json").write_text(json.dumps(meta))
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
            raise CorruptIndex(d / "tools.faiss",
                               f"FAISS cannot read it ({str(e).splitlines()[0]})") from None
        if index.ntotal != len(registry):
            raise ValueError(f"{d / 'tools.faiss'}: index holds {index.ntotal} vectors, "
                             f"registry {len(registry)}")
        obj = cls.__new__(cls)
        obj.names, obj.factory = tuple(meta["names"]), meta["factory"]
        try:
            obj.vectors = np.load(d / "tool_vectors.npy")
        except (OSError, ValueError) as e:
            raise CorruptIndex(d / "tool_vectors.npy", f"numpy cannot read it ({e})") from None
        if obj.vectors.ndim != 2 or len(obj.vectors) != len(registry):
            raise CorruptIndex(d / "tool_vectors.npy",
                               f"shape {obj.vectors.shape}, expected [{len(registry)}, d]")
        obj.dim = obj.vectors.shape[1]
        obj.ann_k = int(meta.get("ann_k", ANN_K))
        given = meta.get("ef_search")
        obj.ef_given = None if given is None else int(given)
        obj.ef_search = ef_search_for(len(registry), obj.ann_k) if given is None else int(given)
        obj._cpu = index
        obj._tune()
        obj.index = _maybe_gpu(index, use_gpu)
        return obj
