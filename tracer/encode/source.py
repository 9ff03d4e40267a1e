"""Where an encoder's weights come from, and the content hash that names everything derived from them.

Exports (ONNX), distillations (model2vec) and fine-tuned checkpoints are built offline from a local
sentence-transformers folder into ``<encoder_dir>/<kind>-<hash>/`` and never committed. The hash covers
the source folder's weights, tokenizer and configs plus the recipe, so a new base model or a new
recipe gets a new directory and a new embedding-cache name, and an existing one is reused as is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tracer.encode.embedders import minilm_path

MINILM_NAMES = (None, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
DEFAULT_CACHE = ".cache/encoders"
# files whose bytes decide what a sentence-transformers folder computes (README and the like do not)
_HASHED_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")


def model_folder(model: str | Path | None) -> Path:
    """A local model folder: ``None`` or the MiniLM names mean the bundled all-MiniLM-L6-v2."""
    path = minilm_path() if model in MINILM_NAMES else Path(model)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a local transformer folder (no config.json)")
    return path


def folder_hash(folder: str | Path) -> str:
    """sha256 over the relative paths and bytes of the files that define a model folder."""
    folder = Path(folder)
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _HASHED_SUFFIXES
                    and not p.name.startswith(".") and p.name != "train_info.json"):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def recipe_hash(**parts: Any) -> str:
    """sha256 of a JSON-serialisable recipe (keys sorted), for cache directory names."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def short_name(model: str | Path | None) -> str:
    """A readable label for a model folder: ``all-MiniLM-L6-v2`` or the folder's own name."""
    return "all-MiniLM-L6-v2" if model in MINILM_NAMES else Path(model).name
