"""Fixtures of the gateway tests: the index they serve (:func:`gateway_harness.save_test_index`), fitted and
saved once per worker, and a copy of it for each test module (what a module's tests write, a reload or what
they learn, stays in its own copy)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from gateway_harness import save_test_index


@pytest.fixture(scope="session")
def saved_index(tmp_path_factory, minilm) -> Path:
    """The index as saved once; tests take copies (:func:`index_dir`, or ``shutil.copytree`` of their own)."""
    return save_test_index(tmp_path_factory.mktemp("gateway-saved") / "index", minilm)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, saved_index) -> Path:
    return Path(shutil.copytree(saved_index, tmp_path_factory.mktemp("gateway") / "index"))


@pytest.fixture(scope="module")
def process_index_dir(tmp_path_factory, static_minilm) -> Path:
    """The same index over the static MiniLM (conftest's ``static_minilm``), for the tests that start ``tracer
    serve`` or ``tracer mcp`` as a process: it loads there in a second, where MiniLM's libraries take several
    to import; what those tests check does not rest on which encoder ranks."""
    return save_test_index(tmp_path_factory.mktemp("gateway-process") / "index", static_minilm)
