"""Where an encoder's weights come from, and the content hash that names everything derived from them.

Exports (ONNX), distillations (model2vec) and fine-tuned checkpoints are built offline from a local
sentence-transformers folder into ``<encoder_dir>/<kind>-<hash>/`` and never committed. The hash covers
the source folder's weights, tokenizer and configs plus the recipe, so a new base model or a new
recipe gets a new directory and a new embedding-cache name. An existing one is reused once it matches the
manifest written when it was built, and built again when it does not (:mod:`tracer.encode.manifest`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tracer.encode.embedders import minilm_path
from tracer.encode.manifest import MANIFEST, fingerprint, folder_hash

__all__ = ["DEFAULT_CACHE", "MINILM_NAMES", "folder_hash", "model_folder", "recipe_hash", "short_name",
           "source_hash"]

MINILM_NAMES = (None, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
DEFAULT_CACHE = ".cache/encoders"


def model_folder(model: str | Path | None) -> Path:
    """A local model folder: ``None`` or the MiniLM names mean the bundled all-MiniLM-L6-v2."""
    path = minilm_path() if model in MINILM_NAMES else Path(model)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a local transformer folder (no config.json)")
    return path


def source_hash(model: str | Path | None) -> tuple[Path, str]:
    """The local model folder of ``model`` and the hash its derived artifacts' keys carry
    (:func:`folder_hash`). A folder that is itself a tracer artifact (a fine-tuned checkpoint exported or
    distilled in turn) is verified against its manifest first: a damaged one is an error naming the file,
    never the source of a new artifact."""
    folder = model_folder(model)
    if (folder / MANIFEST).is_file():
        fingerprint(folder)
    return folder, folder_hash(folder)


def recipe_hash(**parts: Any) -> str:
    """sha256 of a JSON-serialisable recipe (keys sorted), for cache directory names."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def short_name(model: str | Path | None) -> str:
    """A readable label for a model folder: ``all-MiniLM-L6-v2`` or the folder's own name."""
    return "all-MiniLM-L6-v2" if model in MINILM_NAMES else Path(model).name
