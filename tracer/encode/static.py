"""A static encoder: per-token vectors distilled from a sentence-transformers model with model2vec.

``model2vec.distill`` runs the model once over its own vocabulary (no corpus, no hub when the
model is a local folder), reduces the token vectors with PCA and weights them by SIF; encoding
is then a lookup and a mean, 40-90x faster than the transformer for one short text, at the cost
of word order and context. Distilled once into ``<encoder_dir>/m2v-<hash>/`` and reused while it matches its
manifest (:mod:`tracer.encode.manifest`).

    python -m tracer.encode.static          # distil MiniLM into .cache/encoders
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from model2vec import StaticModel

from tracer.encode.bundle import Served, every_file
from tracer.encode.manifest import fingerprint, new_artifact, one_builder, reuse, verify
from tracer.encode.source import DEFAULT_CACHE, recipe_hash, short_name, source_hash


def distilled(model: str | Path | None = None, pca_dims: int | None = 256,
              encoder_dir: str | Path = DEFAULT_CACHE) -> Path:
    """Distil ``model`` into ``<encoder_dir>/m2v-<hash>/``, reused when it matches its manifest and distilled
    again when it does not (:mod:`tracer.encode.manifest`); returns the folder."""
    return _distilled(model, pca_dims, encoder_dir)[0]


def _distilled(model: str | Path | None, pca_dims: int | None, encoder_dir: str | Path) -> tuple[Path, str]:
    folder, weights = source_hash(model)
    key = recipe_hash(kind="model2vec", weights=weights, pca_dims=pca_dims, sif=1e-4, pooling="mean")
    out = Path(encoder_dir) / f"m2v-{key[:16]}"
    if (digest := reuse(out)) is not None:
        return out, digest
    with one_builder(out):
        if (digest := reuse(out)) is not None:  # another process built it while this one waited
            return out, digest
        _distil(folder, pca_dims, out, key, model)
    return out, verify(out)


def _distil(folder: Path, pca_dims: int | None, out: Path, key: str, model: str | Path | None) -> None:
    # imported on a cache miss only: model2vec.distill pulls in the whole transformers stack (~4-7 s), which
    # every process that merely imports this module (each evaluate.py and tracer start) would pay
    from model2vec.distill import distill

    with new_artifact(out, {"kind": "model2vec", "key": key}) as tmp:
        # the CPU: distillation is one pass over a 30k-word vocabulary; seeding fixes the PCA's solver
        torch.manual_seed(0)
        distill(model_name=str(folder), pca_dims=pca_dims, device="cpu").save_pretrained(str(tmp / "model"))
        (tmp / "source.json").write_text(json.dumps({"model": str(folder), "name": short_name(model),
                                                      "key": key}))


class StaticEmbedder:
    """A model2vec static model distilled from a local sentence-transformers folder.

    Args:
        model: local model folder (``None``: the bundled MiniLM); distilled on first use, or a static model
            folder (``m2v-*``, with its ``source.json``) loaded as it is.
        pca_dims: output dimension (``None``: the model's own).
        encoder_dir: where distillations live.
    """

    def __init__(self, model: str | Path | None = None, pca_dims: int | None = 256,
                 encoder_dir: str | Path = DEFAULT_CACHE):
        # a folder that is a static model already (a trained one, tracer/learn/static_encoder.py) loads as it
        # is (verified against its manifest: with no source here, a damaged one is an error naming the file)
        ready = model is not None and (Path(model) / "source.json").is_file()
        self.dir, self.fingerprint = ((Path(model), fingerprint(model)) if ready
                                      else _distilled(model, pca_dims, encoder_dir))
        meta = json.loads((self.dir / "source.json").read_text())
        self.name = f"{meta['name']}-m2v-{meta['key'][:16]}"
        self.model = StaticModel.from_pretrained(str(self.dir / "model"))
        self.dim = int(self.model.dim)

    def served(self) -> Served:
        """The static model's folder (the table, its tokenizer, ``source.json``), for a saved index to
        carry."""
        return Served(self.dir, every_file(self.dir), {})

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        vecs = self.model.encode(list(texts), use_multiprocessing=False).astype(np.float32)   # [N, d]
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        # a text with no known token maps to the zero vector: keep it zero rather than divide by 0
        return torch.from_numpy(vecs / np.where(norms > 0, norms, 1.0))                     # [N, d]


if __name__ == "__main__":
    print(distilled())
