"""The embedding cache survives a damaged shard: a warning names it, it is moved aside (never deleted) and
its texts are encoded again; nothing is fatal."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from builders import KeywordEmbedder

from tracer.encode.embedders import CachedEmbedder

TEXTS = ["book a flight", "the weather in Paris", "send an email", "list my files"]


def shard_of(cache_dir):
    shards = sorted(cache_dir.rglob("*.npz"))
    assert len(shards) == 1
    return shards[0]


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_vector_byte(path):
    """A byte inside the stored float32 vectors: only the zip CRC catches it."""
    with np.load(path) as z:
        vecs = z["vecs"].tobytes()
    data = bytearray(path.read_bytes())
    data[bytes(data).index(vecs) + len(vecs) - 1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, flip_a_vector_byte, lambda p: p.write_bytes(b"")])
def test_a_damaged_shard_is_reported_quarantined_and_recomputed(tmp_path, damage):
    first = CachedEmbedder(KeywordEmbedder(), tmp_path)
    want = first.encode(TEXTS)
    shard = shard_of(tmp_path)
    damage(shard)
    with pytest.warns(RuntimeWarning,
                      match=rf"{shard.name}: corrupt embedding-cache shard .* moved to {shard.name}.corrupt"):
        again = CachedEmbedder(KeywordEmbedder(), tmp_path)
    assert not shard.exists() and shard.with_name(shard.name + ".corrupt").exists()  # aside, not deleted
    torch.testing.assert_close(again.encode(TEXTS), want, rtol=0, atol=0)
    assert again.n_encoded == len(TEXTS)                                             # recomputed
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                               # the next run is clean
        third = CachedEmbedder(KeywordEmbedder(), tmp_path)
    torch.testing.assert_close(third.encode(TEXTS), want, rtol=0, atol=0)
    assert third.n_encoded == 0
