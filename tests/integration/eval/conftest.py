"""Fixtures shared by the evaluation tests."""

from __future__ import annotations

import pytest
from builders import KeywordEmbedder

from tracer.data import Dataset, load_dataset
from tracer.scorer_base.resources import Resources


@pytest.fixture(scope="module")
def bfcl_small():
    """BFCL's first two base conversations over its whole registry, with the keyword embedder: a real
    environment and checker at the cost of a toy encoder."""
    ds = load_dataset("bfcl", categories=["base"])
    trajs = tuple(t for t in ds.trajectories if t.id in ("multi_turn_base_0", "multi_turn_base_1"))
    small = Dataset("bfcl-small", ds.registry, trajs, environment=ds.environment)
    return small, Resources.build(small.registry, KeywordEmbedder(), device="cpu")
