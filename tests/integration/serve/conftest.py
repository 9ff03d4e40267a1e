"""Fixtures of the gateway tests: the index they serve (:func:`gateway_harness.save_test_index`), saved
once per test module."""

from __future__ import annotations

import pytest
from gateway_harness import save_test_index


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, minilm):
    return save_test_index(tmp_path_factory.mktemp("gateway") / "index", minilm)
