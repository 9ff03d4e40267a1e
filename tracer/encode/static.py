"""A static encoder: per-token vectors distilled from a sentence-transformers model with model2vec.

``model2vec.distill`` runs the model once over its own vocabulary (no corpus, no hub when the
model is a local folder), reduces the token vectors with PCA and weights them by SIF; encoding
is then a lookup and a mean, 40-90x faster than the transformer for one short text, at the cost
of word order and context. The forward pass and the PCA run in float64, so that the float16 table is the same
bits on every processor. Distilled once into ``<encoder_dir>/m2v-<hash>/`` and reused while it matches its
manifest (:mod:`tracer.encode.manifest`).

    python -m tracer.encode.static          # distil MiniLM into .cache/encoders
"""

from __future__ import annotations

import inspect
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
    key = recipe_hash(kind="model2vec", weights=weights, pca_dims=pca_dims, sif=1e-4, pooling="mean",
                      forward="float64")
    out = Path(encoder_dir) / f"m2v-{key[:16]}"
    if (digest := reuse(out)) is not None:
        return out, digest
    with one_builder(out):
        if (digest := reuse(out)) is not None:  # another process built it while this one waited
            return out, digest
        _distil(folder, pca_dims, out, key, model)
    return out, verify(out)


def _float64_embeddings(tokenized: list[list[int]], model, device: str, pad_token_id: int,
                        pooling: str = "mean") -> np.ndarray:
    """model2vec's ``create_embeddings`` (mean pooling) with the forward pass, the mean and so the PCA after
    it in float64: float32 kernels round differently under other vector instructions (AVX-512, AVX2, none),
    and the float16 table model2vec stores turns those last bits into whole units (3% of the entries), while
    float64's differences stay far below a float16 unit. ``[V, H]`` in ``tokenized``'s order."""
    assert pooling == "mean", pooling
    model = model.to(device=device, dtype=torch.float64).eval()
    typed = "token_type_ids" in inspect.signature(model.forward).parameters  # as model2vec asks
    rows = []
    with torch.inference_mode():
        for start in range(0, len(tokenized), 256):
            batch = [torch.tensor(ids) for ids in tokenized[start:start + 256]]
            ids = torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=pad_token_id)
            mask = (torch.arange(ids.shape[1])[None, :] < torch.tensor([len(b) for b in batch])[:, None])
            types = {"token_type_ids": torch.zeros_like(ids)} if typed else {}
            hidden = model(input_ids=ids, attention_mask=mask.long(), **types).last_hidden_state  # [B, L, H]
            weights = mask.double() / mask.sum(1, keepdim=True)                              # [B, L]
            rows.append((weights[:, :, None] * hidden).sum(1).numpy())                       # [B, H]
    return np.concatenate(rows)


def _distil(folder: Path, pca_dims: int | None, out: Path, key: str, model: str | Path | None) -> None:
    # imported on a cache miss only: model2vec.distill pulls in the whole transformers stack (~4-7 s), which
    # every process that merely imports this module (each evaluate.py and tracer start) would pay
    from unittest import mock

    from model2vec.distill import distill, distillation

    with new_artifact(out, {"kind": "model2vec", "key": key}) as tmp:
        # the CPU: distillation is one pass over a 30k-word vocabulary; model2vec's own steps (vocabulary,
        # PCA, SIF weights, float16) around a float64 forward pass: the same table on every processor
        with mock.patch.object(distillation, "create_embeddings", _float64_embeddings):
            static = distill(model_name=str(folder), pca_dims=pca_dims, device="cpu")
        static.save_pretrained(str(tmp / "model"))
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
        # a folder that is a static model already (a trained one, tracer/learn/encoders/static.py) loads as
        # it is (verified against its manifest: with no source here, a damaged one is an error naming the
        # file)
        ready = model is not None and (Path(model) / "source.json").is_file()
        self.dir, self.fingerprint = ((Path(model), fingerprint(model)) if ready
                                      else _distilled(model, pca_dims, encoder_dir))
        meta = json.loads((self.dir / "source.json").read_text())
        self.name = f"{meta['name']}-m2v-{meta['key'][:16]}"
        self.model = StaticModel.from_pretrained(str(self.dir / "model"))
        self.dim = int(self.model.dim)
        # the truncation StaticModel.encode sets around each call, set once for _means
        if self.model.max_length is None:
            self.model.tokenizer.no_truncation()
        else:
            self.model.tokenizer.enable_truncation(self.model.max_length)

    def served(self) -> Served:
        """The static model's folder (the table, its tokenizer, ``source.json``), for a saved index to
        carry."""
        return Served(self.dir, every_file(self.dir), {})

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        vecs = self._means(list(texts)).astype(np.float32)                                  # [N, d]
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        # a text with no known token maps to the zero vector: keep it zero rather than divide by 0
        return torch.from_numpy(vecs / np.where(norms > 0, norms, 1.0))                     # [N, d]

    def _means(self, texts: list[str]) -> np.ndarray:
        """``StaticModel.encode(texts)``, the same bits, ``[N, d]``: model2vec's own batch step
        (``_encode_batch``: the tokens' rows meaned, int8, weighted and mapped tables included, normalised
        when the model normalises) after the cut ``encode`` makes, to that many median-length tokens'
        characters (the tokenizer cuts at ``max_length`` tokens, set in ``__init__``). Why not ``encode``
        itself: for the one text of a live step, its batching, progress bar and truncation switches around
        that step cost about 50 µs (``python -m benchmarks.bench_static_encode``, docs/performance.md). A
        private method, so model2vec is pinned to a minor version (pyproject.toml) and
        ``tests/integration/learn/test_static_encoder.py`` holds the bits equal."""
        m = self.model
        if m.max_length is not None:
            cut = m.max_length * m.median_token_length
            texts = [text[:cut] for text in texts]
        return m._encode_batch(texts, m.normalize)                                          # [N, d]


if __name__ == "__main__":
    print(distilled())
