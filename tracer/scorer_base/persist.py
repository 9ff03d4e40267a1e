"""What every saved tracer index shares: meta.json, the registry, the FAISS tool index, and the checks on
load.

A saved index directory holds ``meta.json`` (format version, scorer class and config, embedder name
and dimension, the tools masked out by drift: ``removed``), ``tools.json`` (the registry), ``tools.faiss`` +
``tools_idmap.json`` + ``tool_vectors.npy`` (the fallback index and its id map), ``applied.npy`` (the ledger
of logged trajectories already learned: :mod:`tracer.core.applied`), plus the scorer's own tensors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from tracer.core.applied import Applied
from tracer.core.store import CorruptIndex, Verify, current_path, open_snapshot, read_json
from tracer.core.types import Registry, Tool
from tracer.encode.bundle import carry
from tracer.encode.embedders import CachedEmbedder, Embedder, default_device
from tracer.encode.index import ToolIndex
from tracer.memory.trie import ExecutionTrie
from tracer.scorer_base.resources import Resources

# the scorer YAMLs (tracer/configs/scorer/), read here for saved configs older than their keys
SCORER_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "scorer"


def saved_config(saved: dict[str, Any], reference: str) -> dict[str, Any]:
    """A saved index's scorer config (``meta["scorer"]``) completed from
    ``tracer/configs/scorer/<reference>.yaml``: a key an older version did not write (a constructor argument
    added since, a ``head`` field) takes the YAML's value, which is what that version's Python default was;
    saved keys win, mappings merge key by key."""
    yaml = OmegaConf.load(SCORER_CONFIGS / f"{reference}.yaml")
    merged = OmegaConf.to_container(OmegaConf.merge(yaml, saved), resolve=True)
    merged.pop("_target_", None)
    return merged


def write_common(tmp: Path, meta: dict[str, Any], res: Resources) -> None:
    """Write meta.json (with the embedder's name, dimension and, when known, the config that builds it, and
    the removed tools), the registry, the tool index, the applied ledger and the encoder's files
    (:func:`embedder_entry`) into ``tmp``, a snapshot being written."""
    meta = {**meta, "embedder": embedder_entry(res.embedder, tmp), "removed": sorted(res.removed)}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    (tmp / "tools.json").write_text(json.dumps([{**t.to_openai(), "source": t.source} for t in res.registry]))
    res.tool_index.save(tmp)
    res.applied.save(tmp)


def embedder_entry(embedder: Embedder, tmp: Path) -> dict[str, Any]:
    """meta.json's record of an embedder: name and dimension; for one built from a config, that config, and
    the files it runs on carried into the snapshot (``files``: ``encoders/<id>``,
    :mod:`tracer.encode.bundle`), so the index loads with no cache and from any directory."""
    entry: dict[str, Any] = {"name": embedder.name, "dim": embedder.dim}
    if not isinstance(embedder, CachedEmbedder) or embedder.config is None:
        return entry
    config = dict(embedder.config)
    carried = carry(embedder.inner, tmp, current_path(tmp.parent.parent))
    if carried is not None:
        rel, overrides = carried
        config |= {**overrides, "model": rel}
        config.pop("encoder_dir", None)  # where it would be built: a carried encoder is loaded, never built
        entry["files"] = rel
    return entry | {"config": config}


def open_common(directory: str | Path, embedder: Embedder, class_path: str, format_version: int,
                device: str | None = None) -> tuple[dict[str, Any], Resources]:
    """Read and check meta.json, the registry and the tool index: a missing index, another format
    version or class, another embedder (name or dimension) or a FAISS id map that does not match the
    registry is a clear error."""
    d = Path(directory)
    if not (d / "meta.json").exists():
        raise FileNotFoundError(f"{d}: no saved index here (meta.json missing)")
    meta = read_meta(d / "meta.json")
    if meta.get("format_version") != format_version or meta.get("class", class_path) != class_path:
        raise ValueError(f"{d / 'meta.json'}: format version {meta.get('format_version')} is not "
                         f"{format_version} (class {meta.get('class')}, expected {class_path}); rebuild the "
                         "index")
    want = meta["embedder"]
    if want["name"] != embedder.name or want["dim"] != embedder.dim:
        raise ValueError(f"{d / 'meta.json'}: index was built with embedder {want['name']!r} "
                         f"(dim {want['dim']}), not {embedder.name!r} (dim {embedder.dim}); load it with "
                         "that embedder or rebuild")
    tools = read_json(d / "tools.json")
    try:
        registry = Registry(Tool.from_openai(o, o.get("source", "")) for o in tools)
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        raise CorruptIndex(d / "tools.json",
                           f"not a list of OpenAI tool objects ({type(e).__name__}: {e})") from None
    tool_index = ToolIndex.load(d, registry)
    if tool_index.dim != embedder.dim:
        raise ValueError(f"{d}: tool vectors have dim {tool_index.dim}, the embedder {embedder.dim}")
    removed = meta.get("removed", [])  # absent from an index saved before the mask was: nothing removed
    if not isinstance(removed, list) or not all(isinstance(n, str) and n in registry for n in removed):
        raise CorruptIndex(d / "meta.json", f"expected a list of registered tool names, got {removed!r}",
                           field="removed")
    return meta, Resources(registry, embedder, tool_index, device or default_device(),
                           removed=frozenset(removed), applied=Applied.load(d))


@contextmanager
def open_index(directory: str | Path, embedder: Embedder, class_path: str, format_version: int,
               device: str | None = None,
               verify: Verify = "sha256") -> Iterator[tuple[Path, dict[str, Any], Resources]]:
    """``with open_index(...) as (snapshot, meta, res):`` the current snapshot, verified against its
    manifest (:func:`tracer.core.store.open_snapshot`), with its meta.json and resources checked by
    :func:`open_common`."""
    with open_snapshot(directory, verify) as d:
        yield (d, *open_common(d, embedder, class_path, format_version, device))


def read_meta(path: Path) -> dict[str, Any]:
    """meta.json: an object with a format version, a class and an embedder ``{name, dim}``, else a
    CorruptIndex."""
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise CorruptIndex(path, "expected a JSON object")
    for key in ("embedder", "slow_embedder"):  # slow_embedder: a cascade's second encoder, when it has one
        emb = meta.get(key)
        if key != "embedder" and emb is None:
            continue
        if (not isinstance(emb, dict) or not isinstance(emb.get("name"), str)
                or not isinstance(emb.get("dim"), int)):
            raise CorruptIndex(path, f"missing or malformed '{key}' ({{'name': str, 'dim': int}})", field=key)
        if not isinstance(emb.get("files", ""), str):
            raise CorruptIndex(path, f"'{key}.files' must be a path inside the snapshot",
                               field=f"{key}.files")
        cfg = emb.get("config")
        if cfg is not None and not encoder_config(cfg):
            # a saved file must not name arbitrary code: only encoders of tracer.encode, with plain arguments
            raise CorruptIndex(path, f"'{key}.config' must be a mapping whose _target_ is in tracer.encode, "
                               "its arguments plain values or such mappings (nested encoder configs)",
                               field=f"{key}.config")
    return meta


def encoder_config(cfg: Any) -> bool:
    """Whether ``cfg`` builds only encoders of ``tracer.encode``: a ``_target_`` there, and arguments that are
    plain values or, nested, configs of the same kind (no lists: nothing else to hide a target in)."""
    return (isinstance(cfg, dict) and str(cfg.get("_target_", "")).startswith("tracer.encode.")
            and all(encoder_config(v) if isinstance(v, dict) else not isinstance(v, list)
                    for v in cfg.values()))


def load_tensors(path: Path, mmap: bool = False) -> Any:
    """``torch.load`` of an index file (tensors only); an unreadable file is a CorruptIndex naming it."""
    try:
        return torch.load(path, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CorruptIndex(path, "file missing") from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise CorruptIndex(path, f"torch cannot read it ({str(e).splitlines()[0][:200]})") from None


def check_trie(trie: ExecutionTrie, res: Resources, where: Path) -> ExecutionTrie:
    if trie.dim != res.embedder.dim or trie.n_tools != len(res.registry):
        raise ValueError(f"{where}: trie is over {trie.n_tools} tools of dim {trie.dim}, expected "
                         f"{len(res.registry)} tools of dim {res.embedder.dim}")
    return trie
