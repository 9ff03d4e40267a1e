"""The FAISS tool index: search against brute force (torch.topk), the exact dense path against FAISS,
the single-query path against the batched one, and persistence with its id map."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tracer.core.types import Registry, Tool
from tracer.encode.index import ToolIndex
from tracer.scorer_base.single_step import dense_scores_one, rank_one, top_scores_one


def unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)),
                                         dim=1)


@pytest.fixture(scope="module")
def random_index() -> ToolIndex:
    return ToolIndex([f"tool_{i}" for i in range(300)], unit_rows(300, 48, seed=0))


def test_search_matches_brute_force_topk(random_index):
    q = unit_rows(64, 48, seed=1)
    scores, ids = random_index.search(q, 10)
    want = torch.topk(q @ torch.from_numpy(random_index.vectors).T, 10)
    assert torch.equal(ids.long(), want.indices)
    torch.testing.assert_close(scores, want.values, atol=1e-6, rtol=0)


def test_search_caps_k_at_the_registry_size(random_index):
    _, ids = random_index.search(unit_rows(2, 48, seed=2), 1000)
    assert ids.shape == (2, 300) and sorted(ids[0].tolist()) == list(range(300))


def faiss_dense(index: ToolIndex, q: torch.Tensor) -> torch.Tensor:
    """What dense_scores returned before the exact matmul: a FAISS search over all N, scattered."""
    scores, ids = index.search(q, len(index))
    return torch.full((q.shape[0], len(index)), float("-inf")).scatter_(1, ids.long(), scores)


def test_exact_dense_scores_equal_faiss(random_index):
    q = unit_rows(40, 48, seed=3)
    dense, faiss_scores = random_index.dense_scores(q), faiss_dense(random_index, q)
    assert dense.dtype == torch.float32 and dense.shape == (40, 300)
    torch.testing.assert_close(dense, faiss_scores, atol=1e-6, rtol=0)
    # the same order, up to scores that tie within float error (the two sum in different orders):
    # read in FAISS's order, the exact scores never rise by more than that error
    order = torch.argsort(faiss_scores, dim=1, descending=True, stable=True)
    in_faiss_order = dense.gather(1, order)  # [40, 300]
    assert (in_faiss_order[:, 1:] - in_faiss_order[:, :-1]).max() <= 1e-6
    gaps = in_faiss_order[:, :-1] - in_faiss_order[:, 1:]
    clear = gaps > 1e-6  # where no tie is possible, the orders agree exactly
    dense_order = torch.argsort(dense, dim=1, descending=True, stable=True)
    assert (clear.float().mean() > 0.99
            and torch.equal(order[:, 0][clear[:, 0]], dense_order[:, 0][clear[:, 0]]))


def test_exact_dense_scores_equal_faiss_on_minilm(minilm, tiny_registry):
    index = ToolIndex.build(tiny_registry, minilm)
    q = minilm.encode(["book me a flight to Boston", "what's the weather like", "email Bob the report",
                       "cancel my reservation", "show the files in this folder"])
    dense, faiss_scores = index.dense_scores(q), faiss_dense(index, q)
    torch.testing.assert_close(dense, faiss_scores, atol=1e-6, rtol=0)
    assert torch.equal(dense.argmax(1), faiss_scores.argmax(1))
    assert [tiny_registry[i].name for i in dense.argmax(1).tolist()] == [
        "book_flight", "get_weather", "send_email", "cancel_booking", "list_files"]


def test_dense_scores_one_equals_the_batched_rows_bit_for_bit(random_index):
    q = unit_rows(200, 48, seed=4)
    batched = random_index.dense_scores(q)
    for i in range(200):
        assert np.array_equal(dense_scores_one(random_index, q[i].numpy()), batched[i].numpy())
    # independent of the batch size
    assert torch.equal(random_index.dense_scores(q[:3]), batched[:3])


def test_approximate_index_retrieves_ann_k_tools_with_exact_scores():
    index = ToolIndex([f"t{i}" for i in range(200)], unit_rows(200, 32, seed=5), factory="HNSW16,Flat",
                      ann_k=10, ef_search=40)
    assert not index.exact
    q = unit_rows(5, 32, seed=6)
    dense = index.dense_scores(q)                                                   # [5, 200]
    exact = ToolIndex(index.names, torch.from_numpy(index.vectors)).dense_scores(q)
    found = torch.isfinite(dense)  # the retrieved tools; every other one scores -inf
    assert (found.sum(1) == 10).all()
    assert torch.equal(dense[found], exact[found])  # rescored exactly: the exact index's numbers
    assert torch.equal(dense.argmax(1), exact.argmax(1))
    assert np.array_equal(dense_scores_one(index, q[0].numpy()), dense[0].numpy())
    ids, scores = index.top_one(q[0].numpy())
    assert np.array_equal(np.sort(ids), np.flatnonzero(found[0].numpy()))
    assert np.all(np.diff(scores) <= 0) and np.array_equal(scores, dense[0].numpy()[ids])


def test_auto_factory_is_exact_up_to_the_threshold_and_hnsw_above(monkeypatch):
    import tracer.encode.index as mod
    monkeypatch.setattr(mod, "EXACT_UP_TO", 100)
    assert ToolIndex([f"t{i}" for i in range(100)], unit_rows(100, 16, seed=1), "auto").exact
    big = ToolIndex([f"t{i}" for i in range(101)], unit_rows(101, 16, seed=1), "auto")
    assert big.factory == mod.ANN_FACTORY and big._cpu.hnsw.efSearch == mod.ANN_K
    with pytest.raises(ValueError, match="ann_k"):
        ToolIndex(["a"], unit_rows(1, 16, seed=1), "HNSW16,Flat", ann_k=50, ef_search=10)


def test_approximate_index_save_load_keeps_its_search_settings(tmp_path):
    index = ToolIndex([f"t{i}" for i in range(200)], unit_rows(200, 32, seed=5), "HNSW16,Flat", ann_k=7,
                      ef_search=21)
    index.save(tmp_path)
    again = ToolIndex.load(tmp_path, Registry(Tool(n) for n in index.names))
    assert (again.ann_k, again.ef_search, again._cpu.hnsw.efSearch) == (7, 21, 21)
    q = unit_rows(4, 32, seed=8)
    assert torch.equal(again.dense_scores(q), index.dense_scores(q))


def test_save_load_round_trip_and_id_map_check(tmp_path, random_index):
    random_index.save(tmp_path)
    registry = Registry(Tool(n) for n in random_index.names)
    again = ToolIndex.load(tmp_path, registry)
    q = unit_rows(8, 48, seed=7)
    assert again.names == random_index.names and again.factory == "Flat"
    assert torch.equal(again.dense_scores(q), random_index.dense_scores(q))
    s1, i1 = again.search(q, 5)
    s2, i2 = random_index.search(q, 5)
    assert torch.equal(i1, i2) and torch.equal(s1, s2)
    shuffled = Registry(Tool(n) for n in reversed(random_index.names))
    with pytest.raises(ValueError, match="id map does not match"):
        ToolIndex.load(tmp_path, shuffled)


def test_names_and_vectors_must_agree():
    with pytest.raises(ValueError, match="2 names but 3 vectors"):
        ToolIndex(["a", "b"], unit_rows(3, 4, seed=0))


def test_top_scores_one_keeps_the_exact_leaders_of_a_large_registry():


    vecs = unit_rows(5000, 64, seed=8)
    vecs[100:110] = vecs[7]       # exact ties
    vecs[200] = torch.nn.functional.normalize(vecs[7] + 1e-7, dim=0)  # near-ties
    index = ToolIndex([f"t{i}" for i in range(5000)], vecs)
    queries = torch.cat([unit_rows(30, 64, seed=9), vecs[7:8], -vecs[7:8]])
    none = np.zeros(0, dtype=np.int64)
    for q in queries.numpy():
        full = dense_scores_one(index, q)
        for top, include in ((5, none), (40, np.array([3, 100, 4999])), (1, np.array([7]))):
            part = top_scores_one(index, q, top + len(include), include)
            kept = np.isfinite(part)
            assert np.array_equal(part[kept], full[kept]) and kept[include].all()
            assert kept.sum() < 5000
            fake = np.full(len(include), 1.0, dtype=np.float32)  # proposals scored above everything
            assert np.array_equal(rank_one(include, fake, part, False, top),
                                  rank_one(include, fake, full, False, top))
            assert np.array_equal(rank_one(none, none, part, True, top),
                                  rank_one(none, none, full, True, top))


def test_hnsw_search_breadth_follows_the_registry_size_unless_given(tmp_path):
    from tracer.encode.index import ef_search_for

    assert [ef_search_for(n) for n in (200, 10_000, 40_000, 100_000)] == [32, 32, 64, 102]
    assert ef_search_for(200, ann_k=7) == 32 and ef_search_for(200, ann_k=50) == 50
    auto = ToolIndex([f"t{i}" for i in range(200)], unit_rows(200, 32, seed=5), "HNSW16,Flat", ann_k=7)
    assert (auto.ef_given, auto.ef_search, auto._cpu.hnsw.efSearch) == (None, 32, 32)
    auto.save(tmp_path)
    again = ToolIndex.load(tmp_path, Registry(Tool(n) for n in auto.names))
    assert (again.ef_given, again.ef_search, again._cpu.hnsw.efSearch) == (None, 32, 32)
    fixed = ToolIndex(auto.names, unit_rows(200, 32, seed=5), "HNSW16,Flat", ann_k=7, ef_search=21)
    grown = fixed.with_rows(["new"], unit_rows(1, 32, seed=9))
    assert (grown.ef_given, grown.ef_search, grown._cpu.hnsw.efSearch) == (21, 21, 21)
