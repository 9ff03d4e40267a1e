"""Cached encoder artifacts (ONNX exports, static tables, fine-tuned checkpoints) are verified against the
manifest written when they were built (SHA-256 of every file): a damaged one is moved aside and rebuilt from
its source, or, where it has no source here, refused with an error naming the file; the embedding cache is
keyed by the artifact's content, so vectors computed under one set of files are never served for another.

Every artifact is built from :func:`builders.tiny_bert` (MiniLM's tokenizer, a one-layer BERT of width 32):
real exports, distillations and fine-tunings in seconds."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from builders import TINY_TOOLS, tiny_bert, tiny_trajectories

from tracer.core.context import ContextRendering
from tracer.core.errors import DataError
from tracer.core.types import Registry
from tracer.encode.embedders import CachedEmbedder, SentenceTransformerEmbedder
from tracer.learn.encoders import TrainConfig, finetuned, training_pairs

pytest.importorskip("onnxruntime")
pytest.importorskip("model2vec")

TEXTS = [t.search_text for t in TINY_TOOLS] + ["user: Find me a flight to Paris tomorrow and book it",
                                               "user: What is the weather in Paris?"]
RECIPE = TrainConfig(batch_size=6, lr=1e-3, warmup=0.1, epochs=1, max_seq_length=48, seed=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def built(tiny, tmp_path_factory):
    """One ONNX export, one static distillation and one fine-tuned checkpoint of the tiny model; each test
    works on a copy (``enc``)."""
    from tracer.encode.onnx import export
    from tracer.encode.static import distilled

    enc = tmp_path_factory.mktemp("encoders")
    export(tiny, enc)
    distilled(tiny, None, enc)
    finetuned(_pairs(), RECIPE, tiny, enc, device="cpu")
    return enc


@pytest.fixture
def enc(built, tmp_path):
    return shutil.copytree(built, tmp_path / "encoders")


def _pairs():
    return training_pairs(tiny_trajectories(), Registry(TINY_TOOLS), ContextRendering(join_users=True))


def _only(folder, pattern):
    (found,) = folder.glob(pattern)
    return found


def _stamps(folder):
    """Every entry's inode and mtime: a rebuild or a rewrite changes them."""
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in [folder, *folder.rglob("*")]}


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path, at=0.5):
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def test_an_intact_export_is_verified_against_its_manifest_and_reused(tiny, enc):
    from tracer.encode.onnx import OnnxEmbedder

    out = _only(enc, "onnx-*")
    listed = json.loads((out / "MANIFEST.json").read_text())["files"]
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.json"}
    assert set(listed) == on_disk and {"int8.onnx", "fp32.onnx", "tokenizer/tokenizer.json"} <= on_disk
    stamps = _stamps(enc)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        OnnxEmbedder(tiny, "int8", enc).encode(TEXTS)
    assert _stamps(enc) == stamps                                  # nothing rebuilt, rewritten or moved


@pytest.mark.parametrize("damage, problem", [
    (lambda out: (out / "tokenizer" / "tokenizer.json").unlink(), r"tokenizer/tokenizer.json: .*missing"),
    (lambda out: _truncate(out / "int8.onnx"), r"int8.onnx: .*size"),
    (lambda out: _flip(out / "fp32.onnx"), r"fp32.onnx: .*SHA-256"),
    (lambda out: (out / "MANIFEST.json").unlink(), r"MANIFEST.json: .*no manifest"),  # built before manifests
], ids=["tokenizer-json-removed", "int8-truncated", "fp32-byte-flipped", "no-manifest"])
def test_a_damaged_export_is_moved_aside_and_rebuilt(tiny, enc, damage, problem):
    """A missing tokenizer.json once loaded as a 5-token vocabulary (every word [UNK]); a truncated int8.onnx
    raised a raw InvalidProtobuf on every start. Now either is found, set aside (not deleted) and exported
    again."""
    from tracer.encode.onnx import OnnxEmbedder

    want = {v: OnnxEmbedder(tiny, v, enc).encode(TEXTS) for v in ("fp32", "int8")}
    out = _only(enc, "onnx-*")
    damage(out)
    with pytest.warns(RuntimeWarning, match=problem + r".*moved aside to onnx-[0-9a-f]+\.corrupt-"):
        again = {v: OnnxEmbedder(tiny, v, enc) for v in ("fp32", "int8")}
    for v, emb in again.items():
        torch.testing.assert_close(emb.encode(TEXTS), want[v], atol=1e-6, rtol=0)
    assert _only(enc, "onnx-*.corrupt-*").is_dir()                 # the damaged one, kept for a look
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        OnnxEmbedder(tiny, "int8", enc)                            # the rebuilt export verifies


def test_vectors_cached_under_one_artifact_are_never_served_for_another(tiny, enc, tmp_path):
    """The embedding cache's key carries the artifact's content digest: an export replaced under the same name
    (here its tokenizer reads 'flight' as 'paris' and back) misses the cache."""
    from tracer.encode.manifest import seal
    from tracer.encode.onnx import OnnxEmbedder

    first = CachedEmbedder(OnnxEmbedder(tiny, "fp32", enc), tmp_path / "cache")
    before = first.encode(TEXTS)
    out = _only(enc, "onnx-*")
    doc = json.loads((out / "tokenizer" / "tokenizer.json").read_text())
    vocab = doc["model"]["vocab"]
    vocab["flight"], vocab["paris"] = vocab["paris"], vocab["flight"]
    (out / "tokenizer" / "tokenizer.json").write_text(json.dumps(doc))
    seal(out, json.loads((out / "MANIFEST.json").read_text())["inputs"])   # a valid artifact, other content
    changed = OnnxEmbedder(tiny, "fp32", enc)
    second = CachedEmbedder(changed, tmp_path / "cache")
    assert second.name == first.name and second.fingerprint != first.fingerprint
    got = second.encode(TEXTS)
    # none served from the first artifact's vectors
    assert second.n_encoded == len(TEXTS)
    torch.testing.assert_close(got, changed.encode(TEXTS), atol=0, rtol=0)
    assert not torch.allclose(got, before)                         # it would have been wrong


def test_a_flipped_byte_in_a_static_table_is_rebuilt_or_refused(tiny, enc):
    from tracer.encode.static import StaticEmbedder

    want = StaticEmbedder(tiny, None, enc).encode(TEXTS)
    out = _only(enc, "m2v-*")
    table = out / "model" / "model.safetensors"
    intact = table.read_bytes()
    _flip(table, at=0.9)
    # a table we can distil again: moved aside and rebuilt, byte for byte
    with pytest.warns(RuntimeWarning, match=r"model/model.safetensors: .*SHA-256.*moved aside to m2v-"):
        again = StaticEmbedder(tiny, None, enc)
    torch.testing.assert_close(again.encode(TEXTS), want, atol=0, rtol=0)
    assert table.read_bytes() == intact
    # a static model served from its own folder (a trained table: no source here) is refused, naming the file
    _flip(table, at=0.9)
    with pytest.raises(DataError, match=rf"{table}: .*SHA-256.*cannot be rebuilt here"):
        StaticEmbedder(out)


def test_a_damaged_fine_tuned_checkpoint_is_retrained_or_refused(tiny, enc):
    from tracer.encode.onnx import OnnxEmbedder

    path = _only(enc, "finetuned-*")
    want = SentenceTransformerEmbedder(str(path), device="cpu", progress=0).encode(TEXTS)
    weights = path / "model.safetensors"
    _flip(weights)
    # served as it is (a saved index names the folder): refused, naming the file, by torch and by the ONNX
    # export
    with pytest.raises(DataError, match=rf"{weights}: .*SHA-256.*cannot be rebuilt here"):
        SentenceTransformerEmbedder(str(path), device="cpu", progress=0)
    with pytest.raises(DataError, match=rf"{weights}: .*SHA-256"):
        OnnxEmbedder(path, "fp32", enc)
    # found again by its trainer (the pairs are at hand): set aside and trained again, to the same vectors
    with pytest.warns(RuntimeWarning, match=r"model.safetensors: .*SHA-256.*moved aside to finetuned-"):
        assert finetuned(_pairs(), RECIPE, tiny, enc, device="cpu") == path
    got = SentenceTransformerEmbedder(str(path), device="cpu", progress=0).encode(TEXTS)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_an_unsealed_model_folder_is_fingerprinted_by_its_content(tiny, tmp_path):
    """A folder without a manifest (the bundled MiniLM, a user's own model) is nobody's artifact: it is read
    as it is, and its fingerprint is the hash of its files, so the cache tells two such folders apart under
    one name."""
    other = shutil.copytree(tiny, tmp_path / "other")
    _flip(other / "model.safetensors", at=0.9)
    a = SentenceTransformerEmbedder(str(tiny), device="cpu", progress=0, name="same")
    b = SentenceTransformerEmbedder(str(other), device="cpu", progress=0, name="same")
    assert a.fingerprint and a.fingerprint != b.fingerprint
    ca, cb = CachedEmbedder(a, tmp_path / "cache"), CachedEmbedder(b, tmp_path / "cache")
    ca.encode(TEXTS)
    cb.encode(TEXTS)
    assert cb.n_encoded == len(TEXTS) and ca.cache_dir != cb.cache_dir
