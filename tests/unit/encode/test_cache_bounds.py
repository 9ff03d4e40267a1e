"""The embedding cache stays bounded: its memory is an LRU of ``max_entries`` vectors beside what is on disk,
a cache told so keeps contexts in memory only (tool texts go to disk), and the shards of many runs are
compacted into one when the cache opens."""

from __future__ import annotations

import pytest
import torch
from builders import KeywordEmbedder

from tracer.encode.embedders import MEMORY_ENTRIES, CachedEmbedder
from tracer.encode.shards import COMPACT_AT

TEXTS = [f"text {i}: book a flight" for i in range(6)]


def test_memory_is_a_bounded_lru():
    emb = CachedEmbedder(KeywordEmbedder(), max_entries=3)
    assert CachedEmbedder(KeywordEmbedder()).max_entries == MEMORY_ENTRIES       # the documented default
    for t in TEXTS[:5]:
        emb.encode([t])
    assert len(emb) == 3 and emb.n_encoded == 5                                  # holds texts 2, 3, 4
    emb.encode([TEXTS[2]])                                                       # a hit: 2 is now the newest
    emb.encode([TEXTS[5]])                                                       # evicts 3, the oldest
    assert emb.n_encoded == 6
    emb.encode([TEXTS[2], TEXTS[4], TEXTS[5]])
    assert emb.n_encoded == 6 and len(emb) == 3                                  # all three kept
    emb.encode([TEXTS[3]])
    # 3 was evicted: encoded again
    assert emb.n_encoded == 7
    # one call with more distinct texts than the bound still answers every row
    torch.testing.assert_close(emb.encode(TEXTS), KeywordEmbedder().encode(TEXTS), atol=0, rtol=0)
    assert len(emb) == 3


def test_a_bound_set_later_keeps_the_most_recently_used():
    emb = CachedEmbedder(KeywordEmbedder(), max_entries=4)
    for t in [*TEXTS[:4], TEXTS[0]]:                                             # 0 used again: the newest
        emb.encode([t])
    emb.max_entries = 2                                                          # what the gateway test does
    emb.encode([TEXTS[4]])                                                       # holds 0 and 4
    assert emb.max_entries == 2 and len(emb) == 2 and emb.n_encoded == 5
    emb.encode([TEXTS[0], TEXTS[4]])
    assert emb.n_encoded == 5                                                    # both kept
    emb.encode([TEXTS[3]])
    assert emb.n_encoded == 6                                                    # 3 was not
    with pytest.raises(ValueError, match="max_entries"):
        emb.max_entries = -1


def test_a_cache_told_so_keeps_contexts_in_memory_and_tool_texts_on_disk(tmp_path):
    tools, contexts = TEXTS[:2], TEXTS[2:]
    emb = CachedEmbedder(KeywordEmbedder(), tmp_path, persist_contexts=False)
    emb.encode(contexts)
    assert not list(tmp_path.rglob("*.npz"))                                     # no shard for a context
    # a context seen as a tool text too
    emb.encode_tools(tools + contexts[:1])
    assert len(list(tmp_path.rglob("*.npz"))) == 1
    again = CachedEmbedder(KeywordEmbedder(), tmp_path, persist_contexts=False)
    again.encode_tools(tools + contexts[:1])
    assert again.n_encoded == 0
    again.encode(contexts)
    assert again.n_encoded == len(contexts) - 1


def test_the_shards_of_many_calls_are_compacted_into_one_when_the_cache_opens(tmp_path):
    texts = [f"text {i}" for i in range(COMPACT_AT + 3)]
    first = CachedEmbedder(KeywordEmbedder(), tmp_path)
    for t in texts:
        first.encode([t])
    assert len(list(first.cache_dir.glob("*.npz"))) == len(texts)
    want = first.encode(texts)
    again = CachedEmbedder(KeywordEmbedder(), tmp_path)
    # one shard, nothing else left
    (shard,) = again.cache_dir.glob("*.npz")
    assert sorted(p.name for p in again.cache_dir.iterdir()) == [shard.name]
    torch.testing.assert_close(again.encode(texts), want, atol=0, rtol=0)
    assert again.n_encoded == 0
    # one shard: nothing to compact
    stamp = shard.stat().st_mtime_ns
    CachedEmbedder(KeywordEmbedder(), tmp_path).encode(texts)
    assert shard.stat().st_mtime_ns == stamp
