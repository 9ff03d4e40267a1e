"""What every saved tracer index shares: meta.json, the registry, the FAISS tool index, and the checks on load.

A saved index directory holds ``meta.json`` (format version, scorer class and config, embedder name
and dimension), ``tools.json`` (the registry), ``tools.faiss`` + ``tools_idmap.json`` +
``tool_vectors.npy`` (the fallback index and its id map), plus the scorer's own tensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..embed import Embedder, default_device
from ..index import ToolIndex
from ..trie import ExecutionTrie
from ..types import Registry, Tool
from .base import Resources


def write_common(tmp: Path, meta: dict[str, Any], res: Resources) -> None:
    """Write meta.json (with the embedder's name and dimension), the registry and the tool index into ``tmp``."""
    meta = {**meta, "embedder": {"name": res.embedder.name, "dim": res.embedder.dim}}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    (tmp / "tools.json").write_text(json.dumps([{**t.to_openai(), "source": t.source} for t in res.registry]))
    res.tool_index.save(tmp)


def open_common(directory: str | Path, embedder: Embedder, class_path: str, format_version: int,
                device: str | None = None) -> tuple[dict[str, Any], Resources]:
    """Read and check meta.json, the registry and the tool index: a missing index, another format
    version or class, another embedder (name or dimension) or a FAISS id map that does not match the
    registry is a clear error."""
    d = Path(directory)
    if not (d / "meta.json").exists():
        raise FileNotFoundError(f"{d}: no saved index here (meta.json missing)")
    meta = json.loads((d / "meta.json").read_text())
    if meta.get("format_version") != format_version or meta.get("class", class_path) != class_path:
        raise ValueError(f"{d / 'meta.json'}: format version {meta.get('format_version')} is not {format_version} "
                         f"(class {meta.get('class')}, expected {class_path}); rebuild the index")
    want = meta["embedder"]
    if want["name"] != embedder.name or want["dim"] != embedder.dim:
        raise ValueError(f"{d / 'meta.json'}: index was built with embedder {want['name']!r} (dim {want['dim']}), "
                         f"not {embedder.name!r} (dim {embedder.dim}); load it with that embedder or rebuild")
    registry = Registry(Tool.from_openai(o, o.get("source", "")) for o in json.loads((d / "tools.json").read_text()))
    tool_index = ToolIndex.load(d, registry)
    if tool_index.dim != embedder.dim:
        raise ValueError(f"{d}: tool vectors have dim {tool_index.dim}, the embedder {embedder.dim}")
    return meta, Resources(registry, embedder, tool_index, device or default_device())


def check_trie(trie: ExecutionTrie, res: Resources, where: Path) -> ExecutionTrie:
    if trie.dim != res.embedder.dim or trie.n_tools != len(res.registry):
        raise ValueError(f"{where}: trie is over {trie.n_tools} tools of dim {trie.dim}, expected "
                         f"{len(res.registry)} tools of dim {res.embedder.dim}")
    return trie
